package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/unsettled"
)

// session is one connection and its consume channel. A delivery is only
// ever settled on the channel it arrived on: delivery tags are per
// channel, so a tag must never reach a newer channel.
type session struct {
	src    *Source
	conn   *amqp.Connection
	ch     *amqp.Channel
	closed <-chan *amqp.Error
	dead   chan struct{} // closed by kill

	// mu is held from a tag's removal from live to the send of its
	// settlement, so a multiple ack never covers a tag settled alone.
	mu   sync.Mutex
	live *unsettled.Set[uint64, struct{}] // unsettled tags (a delayed requeue's until its nack); closed by kill

	pubMu sync.Mutex // one republish at a time, so a basic.return is matched to it
	pub   confirmCh
}

// kill marks the session dead: from now on its deliveries refuse to settle.
func (s *session) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.dead:
	default:
		s.live.Close()
		close(s.dead)
	}
}

// take takes e out of live before its settlement is sent; s.mu is held.
// A dead session's delivery is stale: its tag died with the channel.
func (s *session) take(e *unsettled.Entry[uint64, struct{}]) error {
	if err := s.live.Settle(e); err != nil && !errors.Is(err, driver.ErrStaleDelivery) {
		return err
	} else if err != nil || s.ch.IsClosed() {
		return s.stale(1, nil)
	}
	return nil
}

// stale counts n stale settlements and returns their error, wrapping
// err, the failure that revealed the closed channel, if any. An err that
// does not say the channel or connection closed is returned as it is.
func (s *session) stale(n int, err error) error {
	if err != nil && !errors.Is(err, amqp.ErrClosed) {
		return err
	}
	s.src.stale.Add(int64(n))
	if err != nil {
		return driver.Stale(fmt.Errorf("%w: %w", errChannelClosed, err))
	}
	return driver.Stale(errChannelClosed)
}

// settle sends op (a single-tag ack, nack or reject) for e on the
// session's own channel, unless the session is dead.
func (s *session) settle(e *unsettled.Entry[uint64, struct{}], op func(ch *amqp.Channel) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.take(e); err != nil {
		return err
	}
	if err := op(s.ch); err != nil {
		return s.stale(1, err)
	}
	return nil
}

// ackBatch acks ds (all of this session, claimed). See Source.AckBatch.
func (s *session) ackBatch(ds []*delivery) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	taken := ds[:0]
	for _, d := range ds {
		if err := s.take(d.e); err != nil {
			errs = append(errs, d.wrap(err))
		} else {
			taken = append(taken, d)
		}
	}
	ds = taken
	slices.SortFunc(ds, func(a, b *delivery) int { return cmp.Compare(a.tag, b.tag) })
	// The lowest tag still unsettled bounds the run a multiple ack may
	// cover: it acknowledges every unacked tag up to its own.
	run := len(ds)
	if limit, ok := unsettled.Min(s.live); ok {
		run, _ = slices.BinarySearchFunc(ds, limit, func(d *delivery, tag uint64) int { return cmp.Compare(d.tag, tag) })
	}
	rest := ds
	if run >= 2 {
		if err := s.ch.Ack(ds[run-1].tag, true); err != nil {
			return errors.Join(append(errs, s.batchErr(ds, err))...)
		}
		s.src.multipleAcks.Add(1)
		s.src.multipleCount.Add(int64(run))
		rest = ds[run:]
	}
	for i, d := range rest {
		if err := s.ch.Ack(d.tag, false); err != nil {
			return errors.Join(append(errs, s.batchErr(rest[i:], err))...)
		}
	}
	return errors.Join(errs...)
}

// batchErr is the error of acking ds when the ack failed with err.
func (s *session) batchErr(ds []*delivery, err error) error {
	err = s.stale(len(ds), err)
	errs := make([]error, len(ds))
	for i, d := range ds {
		errs[i] = d.wrap(err)
	}
	return errors.Join(errs...)
}

// publish sends one message on the session's confirm channel (mandatory)
// and waits for its confirm.
func (s *session) publish(ctx context.Context, key string, p amqp.Publishing) error {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	select {
	case <-s.dead:
		return s.stale(1, nil)
	default:
	}
	if s.pub.Channel == nil || s.pub.IsClosed() {
		pub, err := openConfirm(s.conn, 4)
		if err != nil {
			// The connection is gone: so is the delivery's channel.
			return s.stale(1, err)
		}
		s.pub = pub
	}
	return s.pub.publish(ctx, "", key, true, p)
}

// confirmCh is a channel in confirm mode and the channel its basic.returns
// arrive on.
type confirmCh struct {
	*amqp.Channel
	returns chan amqp.Return
}

// openConfirm opens a confirm channel on conn whose returns wait in n
// places: at least as many as one publish call sends, since amqp091-go
// drops a notification a listener does not take.
func openConfirm(conn *amqp.Connection, n int) (confirmCh, error) {
	ch, err := conn.Channel()
	if err != nil {
		return confirmCh{}, err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return confirmCh{}, err
	}
	return confirmCh{ch, ch.NotifyReturn(make(chan amqp.Return, n))}, nil
}

// publish publishes ps to exchange with routing key key, nothing else
// awaiting a confirm on c, and waits for their confirms. A returned
// message fails the call, marked driver.Permanent for 312 NO_ROUTE (no
// queue is bound for the key: it fails the same way until one is), and so
// does a nack. A call cut short closes c: a late confirm or return of ps
// could be taken for the next call's, which must start on a fresh channel.
func (c confirmCh) publish(ctx context.Context, exchange, key string, mandatory bool, ps ...amqp.Publishing) error {
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

// delivery is one received message bound to its session.
type delivery struct {
	driver.SettleOnce // the Consumer's settle-once guard, claimed before anything is sent
	sess              *session
	e                 *unsettled.Entry[uint64, struct{}]
	tag               uint64
	raw               amqp.Delivery
	msg               driver.Message
	id                string // the id as the Source read it, before any IDFunc
	idErr             error  // why the message has no usable id
}

// Message returns the received message.
func (d *delivery) Message() *driver.Message { return &d.msg }

// wrap names d in err (nil stays nil).
func (d *delivery) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("rabbitmq: message %q (tag %d): %w", d.msg.ID, d.tag, err)
}

// IDError says why the id header held no usable id (driver.IDErrorer).
func (d *delivery) IDError() error { return d.idErr }

// ack acks d on its channel.
func (d *delivery) ack() error {
	return d.sess.settle(d.e, func(ch *amqp.Channel) error { return ch.Ack(d.tag, false) })
}

// Ack acknowledges the delivery by its tag on the channel it arrived on.
func (d *delivery) Ack(ctx context.Context) error {
	if err := d.Claim(); err != nil {
		return d.wrap(err)
	}
	if err := d.ack(); err != nil {
		return d.wrap(err)
	}
	d.sess.src.attempts.Forget(d.id)
	return nil
}

// Retry asks for a redelivery no sooner than delay, per the Source's
// RetryMode. With RetryRequeue and a positive delay it returns at once and
// nacks when the delay ends; the message stays unacked meanwhile, so a
// crash, Close or failed nack (logged) still gets it redelivered.
func (d *delivery) Retry(ctx context.Context, delay time.Duration) error {
	if err := d.Claim(); err != nil {
		return d.wrap(err)
	}
	src := d.sess.src
	if src.cfg.retryMode == RetryViaQueue {
		p := republishing(&d.raw)
		p.Headers[driver.AttemptHeader] = int64(d.msg.Attempt + 1)
		p.Expiration = strconv.FormatInt(max(delay, 0).Milliseconds(), 10)
		if err := d.sess.publish(ctx, src.cfg.retryQueue, p); err != nil {
			return d.wrap(fmt.Errorf("retry via queue: %w", err))
		}
		// If the ack fails, the copy is in the retry queue and the
		// original comes back too: the dedup store absorbs the extra one.
		return d.wrap(d.ack())
	}
	nack := func() error {
		return d.sess.settle(d.e, func(ch *amqp.Channel) error {
			src.attempts.Requeued(d.id, d.msg.Attempt)
			return ch.Nack(d.tag, false, true)
		})
	}
	if delay <= 0 {
		return d.wrap(nack())
	}
	select {
	case <-d.sess.dead:
		return d.wrap(d.sess.stale(1, nil))
	default:
	}
	if !src.delays.After(delay, func() {
		if err := nack(); err != nil {
			src.logs.Log().Warn("idemq rabbitmq: delayed requeue failed; the broker redelivers the message", "queue", src.cfg.queue, "message_id", d.msg.ID, "error", err)
		}
	}) {
		return d.wrap(driver.Stale(driver.ErrSourceClosed))
	}
	return nil
}

// DeadLetter parks the message with its cause, per the Source's
// DeadLetterMode.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	if err := d.Claim(); err != nil {
		return d.wrap(err)
	}
	src := d.sess.src
	text := "unknown"
	if cause != nil {
		text = cause.Error()
	}
	if src.cfg.deadLetterMode == DeadLetterReject {
		src.logs.Log().Warn("idemq rabbitmq: dead-lettering", "queue", src.cfg.queue, "message_id", d.msg.ID, "cause", text)
		if err := d.sess.settle(d.e, func(ch *amqp.Channel) error { return ch.Reject(d.tag, false) }); err != nil {
			return d.wrap(err)
		}
	} else {
		p := republishing(&d.raw)
		// The time is taken before the publish: never later than the parking.
		mark := deadletter.Mark{Cause: text, Attempt: d.msg.Attempt, Origin: src.cfg.queue, Destination: src.cfg.queue, At: time.Now()}
		for k, v := range mark.Headers() {
			p.Headers[k] = v
		}
		if err := d.sess.publish(ctx, src.cfg.deadLetterQueue, p); err != nil {
			return d.wrap(fmt.Errorf("dead-letter to %q: %w", src.cfg.deadLetterQueue, err))
		}
		if err := d.ack(); err != nil {
			return d.wrap(err)
		}
	}
	src.attempts.Forget(d.id)
	return nil
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

// MetadataRedelivered is the Message.Metadata key of the AMQP redelivered
// flag ("true" or "false"), which the OpenTelemetry conventions have no
// attribute for.
const MetadataRedelivered = "messaging.rabbitmq.message.redelivered_flag"

// toMessage converts an AMQP delivery into m, the pipeline's Message, its
// id read per idHeader (see WithIDHeader). The error says why the id
// header held no usable id (the Message then has none).
func toMessage(m *driver.Message, queue, idHeader string, r *amqp.Delivery) error {
	id, idErr := messageID(idHeader, r)
	key, _ := r.Headers[KeyHeader].(string)
	*m = driver.Message{
		ID:         id,
		Body:       r.Body,
		Key:        key,
		Headers:    renderHeaders(r.Headers),
		Source:     queue,
		System:     "rabbitmq",
		Attempt:    attempt(r),
		ReceivedAt: time.Now(),
	}
	return idErr
}

// metadata is a delivery's Message.Metadata, read from it when asked.
type metadata delivery

// All yields the destination (the exchange), routing key, delivery tag,
// message and correlation ids and the redelivered flag.
func (m *metadata) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		r := &m.raw
		_ = yield(string(semconv.MessagingDestinationNameKey), cmp.Or(r.Exchange, "amq.default")) &&
			yield(string(semconv.MessagingRabbitMQDestinationRoutingKeyKey), r.RoutingKey) &&
			yield(string(semconv.MessagingRabbitMQMessageDeliveryTagKey), strconv.FormatUint(r.DeliveryTag, 10)) &&
			yield(string(semconv.MessagingMessageIDKey), m.id) &&
			yield(string(semconv.MessagingMessageConversationIDKey), r.CorrelationId) &&
			yield(MetadataRedelivered, strconv.FormatBool(r.Redelivered))
	}
}

// messageID reads the business id from the idHeader when the message has
// it, else from message_id; without either, the error says where it looked.
func messageID(idHeader string, r *amqp.Delivery) (string, error) {
	v, ok := r.Headers[idHeader]
	if idHeader == "" || !ok {
		switch {
		case r.MessageId != "":
			return r.MessageId, nil
		case idHeader != "":
			return "", fmt.Errorf("rabbitmq: no header %q and no message_id property", idHeader)
		}
		return "", errors.New("rabbitmq: no message_id property")
	}
	if text, ok := headerText(v); ok {
		return text, nil
	}
	return "", fmt.Errorf("rabbitmq: id header %q holds a %T, not a string, byte array or integer", idHeader, v)
}

// attempt derives the delivery attempt: 2 when the broker flags a
// redelivery, x-delivery-count+1 on quorum queues, or the AttemptHeader of
// a RetryViaQueue copy (plus one if it was redelivered).
func attempt(r *amqp.Delivery) int {
	a := 1
	if r.Redelivered {
		a = 2
	}
	if n, ok := toInt(r.Headers["x-delivery-count"]); ok && n+1 > a {
		a = n + 1
	}
	if n, ok := toInt(r.Headers[driver.AttemptHeader]); ok {
		if r.Redelivered {
			n++
		}
		a = max(a, n)
	}
	return a
}

// toInt reads an AMQP integer, or a string holding one.
func toInt(v any) (int, bool) {
	if _, ok := v.([]byte); ok {
		return 0, false
	}
	text, ok := headerText(v)
	n, err := strconv.Atoi(text)
	return n, ok && err == nil
}

// headerText renders an AMQP string, byte array or integer (any width,
// signed or not) as text, integers in decimal with strconv: fmt.Sprint
// costs several times as much, on every message with a numeric header.
func headerText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	case int64: // what amqp091-go decodes a long long into (timestamps, counts): no reflection
		return strconv.FormatInt(x, 10), true
	case int32:
		return strconv.FormatInt(int64(x), 10), true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(r.Int(), 10), true
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(r.Uint(), 10), true
	}
	return "", false
}

// renderHeaders renders AMQP header values as strings: text and byte
// arrays as they are, numbers and booleans in decimal, times in RFC 3339,
// nested tables and arrays with fmt.
func renderHeaders(t amqp.Table) map[string]string {
	h := make(map[string]string, len(t))
	for k, v := range t {
		text, ok := headerText(v)
		switch x := v.(type) {
		case time.Time:
			text = x.UTC().Format(time.RFC3339)
		case nil:
			text = ""
		case bool:
			text = strconv.FormatBool(x)
		default:
			if !ok {
				text = fmt.Sprint(x)
			}
		}
		h[k] = text
	}
	return h
}
