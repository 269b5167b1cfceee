package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
)

// session is one connection and its consume channel. A delivery is settled
// only on the channel it arrived on: delivery tags are per channel.
type session struct {
	src    *Source
	n      uint64 // the session's rank among the Source's, to sort deliveries by
	conn   *amqp.Connection
	ch     *amqp.Channel
	closed <-chan *amqp.Error

	// mu is held from a tag's removal from live to the send of its
	// settlement, so a multiple settlement never covers a tag settled alone.
	mu       sync.Mutex
	live     map[uint64]struct{} // tags delivered and not settled
	order    []uint64            // live's tags in increasing order, and some that left it since
	tag      string              // the consumer's tag
	released bool                // Release cancelled the consumer
	deferred []uint64            // acked tags not sent yet, a lower tag being live (see flushLocked)
	flushing *time.Timer         // sends deferred acks that waited ackDelay

	pubMu sync.Mutex // one republish at a time, so a basic.return is matched to it
	pub   confirmCh
}

// add records tag as live.
func (s *session) add(tag uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live[tag] = struct{}{}
	if n := len(s.order); n == 0 || s.order[n-1] < tag {
		s.order = append(s.order, tag) // a channel's tags grow: the usual case
	} else if i, found := slices.BinarySearch(s.order, tag); !found {
		s.order = slices.Insert(s.order, i, tag)
	}
}

// lowest returns the lowest live tag, 0 when none is; s.mu is held. It is
// the first of order still live: the tags before it, settled, are dropped,
// and when a long-held delivery keeps mostly settled tags behind it, order
// is compacted to the live ones. Either costs a settled tag once, where a
// scan of live would cost the whole window at each settlement.
func (s *session) lowest() uint64 {
	i := 0
	for i < len(s.order) {
		if _, ok := s.live[s.order[i]]; ok {
			break
		}
		i++
	}
	s.order = s.order[i:]
	if len(s.order) > 2*len(s.live)+64 {
		s.order = slices.DeleteFunc(s.order, func(tag uint64) bool {
			_, ok := s.live[tag]
			return !ok
		})
	}
	if len(s.order) == 0 {
		return 0
	}
	return s.order[0]
}

// staleErr is the error of a settlement that found the delivery's channel
// closed (and its tag dead with it), wrapping err, the failure that showed
// it, if any. Any other err is returned as it is.
func staleErr(err error) error {
	if err == nil {
		return driver.Stale(errors.New("rabbitmq: the delivery's channel is closed"))
	}
	if errors.Is(err, amqp.ErrClosed) {
		return driver.Stale(fmt.Errorf("rabbitmq: the delivery's channel is closed: %w", err))
	}
	return err
}

// pending is a delivery being settled and its index in the call's messages.
type pending struct {
	d *delivery
	i int
}

// fail sets err as the error of each of ps.
func fail(ps []pending, errs []error, err error) {
	for _, p := range ps {
		errs[p.i] = fmt.Errorf("rabbitmq: message %q (tag %d): %w", p.d.msg.ID, p.d.raw.DeliveryTag, err)
	}
}

// settleOp is how a delivery is settled: acked, requeued or rejected.
type settleOp int

const (
	ack settleOp = iota
	requeue
	reject
)

// send settles ps, sorted by tag, with op on the session's channel: one
// call with multiple=true for those below the lowest tag still live once
// ps left it (a multiple settlement covers every unsettled tag up to its
// own, those of deliveries still in flight included), one call per tag for
// the rest. A closed channel's deliveries are stale: nothing is sent. The
// attempts remembered of those settled for good are forgotten.
func (s *session) send(ps []pending, errs []error, op settleOp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sent, err := s.sendLocked(ps, op)
	if sent < len(ps) {
		fail(ps[sent:], errs, staleErr(err))
	}
	for _, p := range ps[:sent] {
		if op != requeue {
			s.src.attempts.Forget(p.d.id)
		}
	}
}

// ackDelay is the longest an ack waits for the tags below it to be
// settled, so that one multiple ack covers them all (Source.ackDelay).
const ackDelay = 25 * time.Millisecond

// sendLocked returns how many of ps it settled, and what stopped it. Acks
// of tags above a live one wait (at most ackDelay, and while fewer than a
// quarter of the prefetch wait) for that tag: batches decided by several
// workers commit out of tag order, and one multiple ack costs the broker
// and the client one frame where single acks cost one frame each.
func (s *session) sendLocked(ps []pending, op settleOp) (int, error) {
	if s.ch.IsClosed() {
		return 0, nil
	}
	if op == ack {
		for _, p := range ps {
			delete(s.live, p.d.raw.DeliveryTag)
			s.deferred = append(s.deferred, p.d.raw.DeliveryTag)
		}
		if err := s.flushLocked(false); err != nil {
			return 0, err
		}
		return len(ps), nil
	}
	// A multiple nack below must not cover a deferred ack.
	if err := s.flushLocked(true); err != nil {
		return 0, err
	}
	for _, p := range ps {
		delete(s.live, p.d.raw.DeliveryTag)
	}
	run := len(ps)
	if low := s.lowest(); low != 0 {
		run, _ = slices.BinarySearchFunc(ps, low, func(p pending, tag uint64) int { return cmp.Compare(p.d.raw.DeliveryTag, tag) })
	}
	if run < 2 {
		run = 0
	} else if err := s.op(op, ps[run-1].d.raw.DeliveryTag, true); err != nil {
		return 0, err
	} else {
		s.src.multipleAcks.Add(1)
		s.src.multipleCount.Add(int64(run))
	}
	for i := run; i < len(ps); i++ {
		if err := s.op(op, ps[i].d.raw.DeliveryTag, false); err != nil {
			return i, err
		}
	}
	return len(ps), nil
}

// flushLocked sends the deferred acks below the lowest live tag as one
// multiple ack, and, with all or when too many wait, the others one by
// one; while some still wait, a timer sends them after ackDelay. s.mu is
// held.
func (s *session) flushLocked(all bool) error {
	if len(s.deferred) == 0 {
		return nil
	}
	slices.Sort(s.deferred)
	run := len(s.deferred)
	if low := s.lowest(); low != 0 {
		run, _ = slices.BinarySearch(s.deferred, low)
	}
	if run > 0 {
		if err := s.op(ack, s.deferred[run-1], run > 1); err != nil {
			s.deferred = s.deferred[:0]
			return err
		}
		if run > 1 {
			s.src.multipleAcks.Add(1)
			s.src.multipleCount.Add(int64(run))
		}
	}
	rest := s.deferred[run:]
	if all || len(rest) > max(s.src.window/4, 1) {
		for _, tag := range rest {
			if err := s.op(ack, tag, false); err != nil {
				s.deferred = s.deferred[:0]
				return err
			}
		}
		rest = nil
	}
	s.deferred = append(s.deferred[:0], rest...)
	if len(s.deferred) == 0 && s.flushing != nil {
		s.flushing.Stop()
		s.flushing = nil
	}
	if len(s.deferred) > 0 && s.flushing == nil {
		s.flushing = time.AfterFunc(time.Duration(s.src.ackDelay.Load()), func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.flushing = nil
			if !s.ch.IsClosed() {
				_ = s.flushLocked(true) // a failed ack is redelivered, and the store knows it
			}
		})
	}
	return nil
}

// flush sends every deferred ack, before the session's connection closes.
func (s *session) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.flushing != nil {
		s.flushing.Stop()
		s.flushing = nil
	}
	if !s.ch.IsClosed() {
		_ = s.flushLocked(true)
	}
}

// op settles tag, or with multiple every unsettled tag up to it.
func (s *session) op(op settleOp, tag uint64, multiple bool) error {
	if op == ack {
		return s.ch.Ack(tag, multiple)
	}
	return s.ch.Nack(tag, multiple, op == requeue)
}

// move publishes a copy of each of ps, as mark changes it, to queue
// (mandatory, confirmed) on the session's connection, then acks the
// originals. If the publish fails, the originals are requeued, so nothing
// is lost, and each gets the publish's error.
func (s *session) move(ctx context.Context, ps []pending, errs []error, queue string, mark func(p pending, pub *amqp.Publishing)) {
	pubs := make([]amqp.Publishing, len(ps))
	for i, p := range ps {
		pubs[i] = republishing(&p.d.raw)
		mark(p, &pubs[i])
	}
	err := s.publish(ctx, queue, pubs...)
	switch {
	case err == nil:
		s.send(ps, errs, ack)
	case errors.Is(err, driver.ErrStaleDelivery):
		fail(ps, errs, err)
	default:
		s.send(ps, errs, requeue)
		for _, p := range ps {
			if errs[p.i] == nil {
				fail([]pending{p}, errs, fmt.Errorf("publishing to %q: %w", queue, err))
			}
		}
	}
}

// publish sends ps on the session's confirm channel, mandatory, confirmed.
func (s *session) publish(ctx context.Context, key string, ps ...amqp.Publishing) error {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	if s.ch.IsClosed() {
		return staleErr(nil)
	}
	if err := s.pub.open(s.conn); err != nil {
		return staleErr(err) // the connection is gone, and the delivery's channel with it
	}
	return s.pub.publish(ctx, "", key, true, ps...)
}

// settle hands ms's deliveries to f, a session's at a time, each session's
// sorted by tag, with errs (errs[i] is ms[i]'s) for f to fill, and returns
// nil or a *driver.Partial of errs.
func (s *Source) settle(ms []*driver.Message, f func(sess *session, ps []pending, errs []error)) error {
	errs := make([]error, len(ms))
	ps := make([]pending, len(ms))
	for i, m := range ms {
		ps[i] = pending{m.AckID.(*delivery), i}
	}
	slices.SortFunc(ps, func(a, b pending) int {
		return cmp.Or(cmp.Compare(a.d.sess.n, b.d.sess.n), cmp.Compare(a.d.raw.DeliveryTag, b.d.raw.DeliveryTag))
	})
	for len(ps) > 0 { // nearly always one session
		n := 1
		for n < len(ps) && ps[n].d.sess == ps[0].d.sess {
			n++
		}
		f(ps[0].d.sess, ps[:n], errs)
		ps = ps[n:]
	}
	for _, err := range errs {
		if errors.Is(err, driver.ErrStaleDelivery) {
			s.stale.Add(1)
		}
	}
	return driver.PartialOf(errs)
}

// Ack implements driver.Source: each message is acked on the channel it
// arrived on by its delivery tag, the tags below every tag still
// unsettled there with one multiple ack; the others wait for the tags
// below them (see sendLocked), and a lost connection redelivers them.
func (s *Source) Ack(_ context.Context, ms []*driver.Message) error {
	return s.settle(ms, func(sess *session, ps []pending, errs []error) { sess.send(ps, errs, ack) })
}

// Retry implements driver.Source per the Source's RetryMode. RetryRequeue
// nacks the messages with requeue at once: the Consumer waited out the
// delay (Traits.DelaysRetry is false). RetryViaQueue publishes a copy of
// each to the retry queue, expiring after delay, with the next attempt in
// driver.AttemptHeader, then acks the original.
func (s *Source) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	expiration := strconv.FormatInt(max(delay, 0).Milliseconds(), 10)
	return s.settle(ms, func(sess *session, ps []pending, errs []error) {
		if s.cfg.retryMode == RetryViaQueue {
			sess.move(ctx, ps, errs, s.cfg.retryQueue, func(p pending, pub *amqp.Publishing) {
				pub.Headers[driver.AttemptHeader] = int64(p.d.msg.Attempt + 1)
				pub.Expiration = expiration
			})
			return
		}
		for _, p := range ps {
			s.attempts.Requeued(p.d.id, p.d.msg.Attempt)
		}
		sess.send(ps, errs, requeue)
	})
}

// Release implements driver.Releaser: the messages are nacked with
// requeue, undecided, so the broker redelivers them at once. The Consumer
// releases only when it stops, so Release first cancels the channel's
// consumer: otherwise the broker would hand the messages straight back to
// it, and a quorum queue would count two deliveries of each (one more
// when Close returns them), bringing them nearer its delivery limit.
func (s *Source) Release(_ context.Context, ms []*driver.Message) error {
	return s.settle(ms, func(sess *session, ps []pending, errs []error) {
		sess.mu.Lock()
		tag, done := sess.tag, sess.released
		sess.released = true
		sess.mu.Unlock()
		if !done {
			_ = sess.ch.Cancel(tag, false) // on failure the channel is gone, and its deliveries with it
		}
		sess.send(ps, errs, requeue)
	})
}

// isReleased reports whether Release cancelled the session's consumer.
func (s *session) isReleased() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.released
}

// DeadLetter implements driver.Source per the Source's DeadLetterMode.
// DeadLetterRepublish publishes a copy of each message with the
// bookkeeping headers (deadletter.Mark) to the dead-letter queue, then
// acks the original; DeadLetterReject logs the cause and rejects the
// message without requeue, for the queue's dead-letter exchange.
func (s *Source) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	at := time.Now() // before the publish: never later than the parking
	return s.settle(ms, func(sess *session, ps []pending, errs []error) {
		if s.cfg.deadLetterMode == DeadLetterRepublish {
			sess.move(ctx, ps, errs, s.cfg.deadLetterQueue, func(p pending, pub *amqp.Publishing) {
				mark := deadletter.Mark{Cause: deadletter.Cause(causes[p.i]), Attempt: p.d.msg.Attempt, Origin: s.cfg.queue, Destination: s.cfg.queue, At: at}
				for k, v := range mark.Headers() {
					pub.Headers[k] = v
				}
			})
			return
		}
		for _, p := range ps {
			s.log.Warn("idemq rabbitmq: dead-lettering", "queue", s.cfg.queue, "message_id", p.d.msg.ID, "cause", deadletter.Cause(causes[p.i]))
		}
		sess.send(ps, errs, reject)
	})
}

// republishing rebuilds r as a persistent publishing with its properties
// and a copy of its headers, less the broker's count of its deliveries.
func republishing(r *amqp.Delivery) amqp.Publishing {
	h := make(amqp.Table, len(r.Headers)+5)
	for k, v := range r.Headers {
		h[k] = v
	}
	delete(h, "x-delivery-count")
	return amqp.Publishing{
		Headers: h, ContentType: r.ContentType, ContentEncoding: r.ContentEncoding, DeliveryMode: amqp.Persistent,
		Priority: r.Priority, CorrelationId: r.CorrelationId, ReplyTo: r.ReplyTo, MessageId: r.MessageId,
		Timestamp: r.Timestamp, Type: r.Type, UserId: r.UserId, AppId: r.AppId, Body: r.Body,
	}
}
