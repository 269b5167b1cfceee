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

// errChannelClosed is the reason of a stale settlement: the delivery's
// channel closed, and its delivery tag died with it, so nothing is sent.
var errChannelClosed = errors.New("rabbitmq: the delivery's channel is closed")

// session is one connection and its consume channel. A delivery is only
// ever settled on the channel it arrived on: delivery tags are per
// channel, so a tag must never reach a newer channel.
type session struct {
	src    *Source
	n      uint64 // the session's rank among the Source's, to sort deliveries by
	conn   *amqp.Connection
	ch     *amqp.Channel
	closed <-chan *amqp.Error

	// mu is held from a tag's removal from live to the send of its
	// settlement, so a multiple settlement never covers a tag settled
	// alone.
	mu       sync.Mutex
	dead     bool                // set by kill: the channel's tags died with it
	live     map[uint64]struct{} // tags delivered and not settled, a delayed retry's included
	low      uint64              // the lowest tag of live, unless it left live since
	tag      string              // the consumer's tag
	released bool                // Release cancelled the consumer

	pubMu sync.Mutex // one republish at a time, so a basic.return is matched to it
	pub   confirmCh
}

// add records tag as live, unless the session is dead.
func (s *session) add(tag uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return false
	}
	if len(s.live) == 0 {
		s.low = tag
	}
	s.live[tag] = struct{}{}
	return true
}

// kill marks the session dead: from now on its deliveries refuse to settle.
func (s *session) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = true
}

// stale reports whether the session's deliveries can no longer be settled.
func (s *session) stale() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead || s.ch.IsClosed()
}

// lowest returns the lowest live tag, 0 when none is; s.mu is held.
func (s *session) lowest() uint64 {
	if _, ok := s.live[s.low]; !ok {
		s.low = 0
		for tag := range s.live {
			if s.low == 0 || tag < s.low {
				s.low = tag
			}
		}
	}
	return s.low
}

// staleErr is the error of a settlement that found the channel closed,
// wrapping err, the failure that revealed it, if any. An err that does not
// say the channel or connection closed is returned as it is.
func staleErr(err error) error {
	if err != nil && !errors.Is(err, amqp.ErrClosed) {
		return err
	}
	if err != nil {
		return driver.Stale(fmt.Errorf("%w: %w", errChannelClosed, err))
	}
	return driver.Stale(errChannelClosed)
}

// pending is a delivery being settled, and its index in the call's
// messages.
type pending struct {
	d *delivery
	i int
}

// fail sets err as the error of each of ps.
func fail(ps []pending, errs []error, err error) {
	for _, p := range ps {
		errs[p.i] = p.d.wrap(err)
	}
}

// settleOp sends one settlement of tag, or with multiple of every
// unsettled tag up to it.
type settleOp func(ch *amqp.Channel, tag uint64, multiple bool) error

var (
	ack     settleOp = func(ch *amqp.Channel, tag uint64, multiple bool) error { return ch.Ack(tag, multiple) }
	requeue settleOp = func(ch *amqp.Channel, tag uint64, multiple bool) error { return ch.Nack(tag, multiple, true) }
	reject  settleOp = func(ch *amqp.Channel, tag uint64, multiple bool) error { return ch.Nack(tag, multiple, false) }
)

// send settles ps, sorted by tag, with op on the session's channel: one
// call with multiple=true for those below the lowest tag still live once ps
// left it (a multiple settlement covers every unsettled tag up to its own,
// those of deliveries still in flight included), one call per tag for the
// rest. A dead session's deliveries are stale: nothing is sent.
func (s *session) send(ps []pending, errs []error, op settleOp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || s.ch.IsClosed() {
		fail(ps, errs, staleErr(nil))
		return
	}
	for _, p := range ps {
		delete(s.live, p.d.tag)
	}
	run := len(ps)
	if low := s.lowest(); low != 0 {
		run, _ = slices.BinarySearchFunc(ps, low, func(p pending, tag uint64) int { return cmp.Compare(p.d.tag, tag) })
	}
	if run >= 2 {
		if err := op(s.ch, ps[run-1].d.tag, true); err != nil {
			fail(ps, errs, staleErr(err))
			return
		}
		s.src.multipleAcks.Add(1)
		s.src.multipleCount.Add(int64(run))
		ps = ps[run:]
	}
	for i, p := range ps {
		if err := op(s.ch, p.d.tag, false); err != nil {
			fail(ps[i:], errs, staleErr(err))
			return
		}
	}
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
	if err == nil {
		s.send(ps, errs, ack)
		return
	}
	if errors.Is(err, driver.ErrStaleDelivery) {
		fail(ps, errs, err)
		return
	}
	s.send(ps, errs, requeue)
	for _, p := range ps {
		if errs[p.i] == nil {
			errs[p.i] = p.d.wrap(fmt.Errorf("publishing to %q: %w", queue, err))
		}
	}
}

// publish sends ps on the session's confirm channel (mandatory) and waits
// for their confirms.
func (s *session) publish(ctx context.Context, key string, ps ...amqp.Publishing) error {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	if s.stale() {
		return staleErr(nil)
	}
	if s.pub.Channel == nil || s.pub.IsClosed() {
		pub, err := openConfirm(s.conn)
		if err != nil {
			// The connection is gone: so is the delivery's channel.
			return staleErr(err)
		}
		s.pub = pub
	}
	return s.pub.publish(ctx, "", key, true, ps...)
}

// settle hands ms's deliveries to f, a session's at a time, each session's
// sorted by tag, with errs (errs[i] is ms[i]'s) for f to fill, and returns
// nil or a *driver.Partial of errs.
func (s *Source) settle(ms []*driver.Message, f func(sess *session, ps []pending, errs []error)) error {
	errs := make([]error, len(ms))
	ps := make([]pending, 0, len(ms))
	for i, m := range ms {
		if d, ok := m.AckID.(*delivery); ok && d.sess.src == s {
			ps = append(ps, pending{d, i})
		} else {
			errs[i] = fmt.Errorf("rabbitmq: message %q is not a delivery of this Source", m.ID)
		}
	}
	slices.SortFunc(ps, func(a, b pending) int {
		return cmp.Or(cmp.Compare(a.d.sess.n, b.d.sess.n), cmp.Compare(a.d.tag, b.d.tag))
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
		if err != nil && errors.Is(err, driver.ErrStaleDelivery) {
			s.stale.Add(1)
		}
	}
	return driver.PartialOf(errs)
}

// forget drops the attempts remembered of ps that settled for good.
func (s *Source) forget(ps []pending, errs []error) {
	for _, p := range ps {
		if errs[p.i] == nil {
			s.attempts.Forget(p.d.id)
		}
	}
}

// Ack implements driver.Source: each message is acked on the channel it
// arrived on by its delivery tag, the batch's tags below every tag still
// unsettled there with one multiple ack.
func (s *Source) Ack(_ context.Context, ms []*driver.Message) error {
	return s.settle(ms, func(sess *session, ps []pending, errs []error) {
		sess.send(ps, errs, ack)
		s.forget(ps, errs)
	})
}

// Retry implements driver.Source per the Source's RetryMode. RetryRequeue
// nacks the messages with requeue at once: the Consumer waited out the
// delay (Traits.DelaysRetry is false). RetryViaQueue publishes a copy of
// each to the retry queue, expiring after delay, with the next attempt in
// driver.AttemptHeader, then acks the original.
func (s *Source) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	if s.cfg.retryMode == RetryViaQueue {
		expiration := strconv.FormatInt(max(delay, 0).Milliseconds(), 10)
		return s.settle(ms, func(sess *session, ps []pending, errs []error) {
			sess.move(ctx, ps, errs, s.cfg.retryQueue, func(p pending, pub *amqp.Publishing) {
				pub.Headers[driver.AttemptHeader] = int64(p.d.msg.Attempt + 1)
				pub.Expiration = expiration
			})
		})
	}
	return s.settle(ms, func(sess *session, ps []pending, errs []error) {
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
		sess.stopConsuming()
		sess.send(ps, errs, requeue)
	})
}

// stopConsuming cancels the session's consumer, once; the session stays
// up for the settlements still to come, until Close.
func (s *session) stopConsuming() {
	s.mu.Lock()
	tag, done := s.tag, s.dead || s.released
	s.released = true
	s.mu.Unlock()
	if !done {
		_ = s.ch.Cancel(tag, false) // on failure the channel is gone, and its deliveries with it
	}
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
		if s.cfg.deadLetterMode == DeadLetterReject {
			for _, p := range ps {
				s.log.Warn("idemq rabbitmq: dead-lettering", "queue", s.cfg.queue, "message_id", p.d.msg.ID, "cause", deadletter.Cause(causes[p.i]))
			}
			sess.send(ps, errs, reject)
		} else {
			sess.move(ctx, ps, errs, s.cfg.deadLetterQueue, func(p pending, pub *amqp.Publishing) {
				mark := deadletter.Mark{Cause: deadletter.Cause(causes[p.i]), Attempt: p.d.msg.Attempt, Origin: s.cfg.queue, Destination: s.cfg.queue, At: at}
				for k, v := range mark.Headers() {
					pub.Headers[k] = v
				}
			})
		}
		s.forget(ps, errs)
	})
}

// republishing rebuilds r as a persistent publishing with its properties
// and a copy of its headers, less the broker's count of the original's
// deliveries.
func republishing(r *amqp.Delivery) amqp.Publishing {
	h := make(amqp.Table, len(r.Headers)+5)
	for k, v := range r.Headers {
		h[k] = v
	}
	delete(h, "x-delivery-count")
	return amqp.Publishing{
		Headers:         h,
		ContentType:     r.ContentType,
		ContentEncoding: r.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        r.Priority,
		CorrelationId:   r.CorrelationId,
		ReplyTo:         r.ReplyTo,
		MessageId:       r.MessageId,
		Timestamp:       r.Timestamp,
		Type:            r.Type,
		UserId:          r.UserId,
		AppId:           r.AppId,
		Body:            r.Body,
	}
}

// confirmChunk bounds the messages awaiting confirms at once, and so the
// basic.returns that can pile up before publish reads them (amqp091-go
// drops a notification a listener does not take).
const confirmChunk = 256

// confirmCh is a channel in confirm mode and the channel its basic.returns
// arrive on.
type confirmCh struct {
	*amqp.Channel
	returns chan amqp.Return
}

// openConfirm opens a confirm channel on conn whose returns wait in
// confirmChunk places.
func openConfirm(conn *amqp.Connection) (confirmCh, error) {
	ch, err := conn.Channel()
	if err != nil {
		return confirmCh{}, err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return confirmCh{}, err
	}
	return confirmCh{ch, ch.NotifyReturn(make(chan amqp.Return, confirmChunk))}, nil
}

// publish publishes ps to exchange with routing key key, nothing else
// awaiting a confirm on c, and waits for their confirms, confirmChunk
// messages at a time. A returned message fails the call, marked
// driver.Permanent for 312 NO_ROUTE (no queue is bound for the key: it
// fails the same way until one is), and so does a nack; the messages
// before it may have been published. A call cut short closes c: a late
// confirm or return of ps could be taken for the next call's, which must
// start on a fresh channel.
func (c confirmCh) publish(ctx context.Context, exchange, key string, mandatory bool, ps ...amqp.Publishing) error {
	for chunk := range slices.Chunk(ps, confirmChunk) {
		if err := c.publishChunk(ctx, exchange, key, mandatory, chunk); err != nil {
			return err
		}
	}
	return nil
}

func (c confirmCh) publishChunk(ctx context.Context, exchange, key string, mandatory bool, ps []amqp.Publishing) error {
	confs := make([]*amqp.DeferredConfirmation, 0, len(ps))
	for _, p := range ps {
		conf, err := c.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, false, p)
		if err != nil {
			c.Close()
			return fmt.Errorf("publish %q: %w", p.MessageId, err)
		}
		confs = append(confs, conf)
	}
	nacked := 0
	for _, conf := range confs {
		acked, err := conf.WaitContext(ctx)
		if err != nil {
			c.Close()
			return fmt.Errorf("waiting for publisher confirms: %w", err)
		}
		if !acked {
			nacked++
		}
	}
	// The broker sends basic.return before the confirm, and amqp091-go
	// hands both over from one reader goroutine, so every return of ps is
	// buffered by now.
	if n := len(c.returns); n > 0 {
		first := <-c.returns
		for range n - 1 {
			<-c.returns
		}
		err := fmt.Errorf("%d of %d messages unroutable with key %q: %d %s", n, len(ps), key, first.ReplyCode, first.ReplyText)
		if first.ReplyCode == amqp.NoRoute {
			return driver.Permanent(err)
		}
		return err
	}
	if nacked > 0 {
		return fmt.Errorf("%d of %d messages not confirmed by the broker", nacked, len(ps))
	}
	return nil
}
