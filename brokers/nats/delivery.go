package nats

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"strconv"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/unsettled"
)

// delivery is one received message.
type delivery struct {
	e  *unsettled.Entry[uint64, jetstream.Msg]
	s  *Source
	md *jetstream.MsgMetadata
	m  driver.Message
}

// metadata is a delivery's Message.Metadata, read from it when asked.
type metadata delivery

// All yields the subject, the consumer, the Nats-Msg-Id, the stream and
// the message's stream and consumer sequences.
func (m *metadata) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		md := m.md
		_ = yield("messaging.destination.name", m.m.Source) &&
			yield("messaging.consumer.group.name", md.Consumer) &&
			yield("messaging.message.id", m.m.Headers[natsgo.MsgIdHdr]) &&
			yield("messaging.nats.stream", md.Stream) &&
			yield("messaging.nats.stream_sequence", strconv.FormatUint(md.Sequence.Stream, 10)) &&
			yield("messaging.nats.consumer_sequence", strconv.FormatUint(md.Sequence.Consumer, 10))
	}
}

// newDelivery reads msg and records it as unsettled.
func (s *Source) newDelivery(msg jetstream.Msg) (driver.Delivery, error) {
	md, err := msg.Metadata()
	if err != nil {
		_ = msg.Nak()
		return nil, fmt.Errorf("nats: a message without JetStream metadata on %s: %w", msg.Subject(), err)
	}
	h := headerMap(msg.Headers())
	id, ok := h[IDHeader]
	if !ok {
		id = h[s.c.idHeader]
	}
	d := &delivery{s: s, md: md, m: driver.Message{
		ID: id, Body: msg.Data(), Headers: h, Key: h[KeyHeader], Source: msg.Subject(), System: "nats",
		Attempt: int(md.NumDelivered), ReceivedAt: time.Now(),
	}}
	d.m.Metadata = (*metadata)(d)
	if d.e = s.live.Add(md.Sequence.Stream, msg); d.e == nil {
		_ = msg.NakWithDelay(giveBackDelay)
		return nil, driver.ErrSourceClosed
	}
	return d, nil
}

// headerMap renders NATS headers as strings, the first value of each.
func headerMap(h natsgo.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) > 0 {
			out[k] = v[0]
		}
	}
	return out
}

// Message implements driver.Delivery.
func (d *delivery) Message() *driver.Message { return &d.m }

// begin claims the right to settle d (unsettled.Set.Settle): when it
// fails, nothing may be sent.
func (d *delivery) begin() error { return d.s.live.Settle(d.e) }

// msg is the JetStream message d delivers.
func (d *delivery) msg() jetstream.Msg { return d.e.D }

// failed wraps the error of a settlement of d; a closed connection means
// the message comes back, so it is stale.
func (d *delivery) failed(what string, err error) error {
	err = fmt.Errorf("nats: %s of %s/%d: %w", what, d.s.c.stream, d.e.Key, err)
	if errors.Is(err, natsgo.ErrConnectionClosed) {
		return driver.Stale(err)
	}
	return err
}

// Ack implements driver.Delivery with a double ack, which waits for the
// server's confirmation: a plain ack lost with a connection would go
// unreported, and the Consumer must learn the message was not settled.
func (d *delivery) Ack(ctx context.Context) error {
	if err := d.begin(); err != nil {
		return err
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	if err := d.msg().DoubleAck(ctx); err != nil {
		return d.failed("ack", err)
	}
	return nil
}

// Retry implements driver.Delivery with a Nak that asks JetStream to
// redeliver after delay, then a flush that confirms the server read it.
func (d *delivery) Retry(ctx context.Context, delay time.Duration) error {
	if err := d.begin(); err != nil {
		return err
	}
	err := d.msg().NakWithDelay(delay) // a plain Nak for 0
	if err == nil {
		err = d.s.flush(ctx)
	}
	if err != nil {
		return d.failed("nak", err)
	}
	return nil
}

// DeadLetter implements driver.Delivery: it terminates the message (Term)
// only once JetStream acked its copy on the dead-letter subject, and gives
// it back (Nak) if the publish fails. The copy's Nats-Msg-Id derives from
// the stream sequence, so a message parked twice (Term lost) is kept once.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	if err := d.begin(); err != nil {
		return err
	}
	s := d.s
	h := natsgo.Header{}
	maps.Copy(h, d.msg().Headers()) // Nats-Msg-Id is replaced below
	if d.m.ID != "" {
		h.Set(IDHeader, d.m.ID)
	}
	mark := deadletter.Mark{Cause: deadletter.Cause(cause), Attempt: d.m.Attempt, Destination: d.msg().Subject(), At: time.Now(),
		Origin: fmt.Sprintf("%s/%s/%d", s.c.stream, s.c.consumer, d.e.Key)}
	for k, v := range mark.Headers() {
		h.Set(k, v)
	}
	h.Set(natsgo.MsgIdHdr, fmt.Sprintf("idemq-dlq:%s:%s:%d", s.c.stream, s.c.consumer, d.e.Key))
	pctx, cancel := bounded(ctx)
	defer cancel()
	if _, err := s.link.js.PublishMsg(pctx, &natsgo.Msg{Subject: s.c.dlqSubject, Header: h, Data: d.msg().Data()}); err != nil {
		_ = d.msg().Nak()
		return d.failed("dead-letter publish to "+s.c.dlqSubject, err)
	}
	err := d.msg().Term()
	if err == nil {
		err = s.flush(ctx)
	}
	if err != nil {
		return d.failed("term after parking", err)
	}
	return nil
}

// bounded gives ctx a deadline if it has none: nats.go's request and
// flush calls need one.
func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, 30*time.Second)
}

// flush waits until the server has read everything sent before.
func (s *Source) flush(ctx context.Context) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	return s.link.nc.FlushWithContext(ctx)
}

// beat sends InProgress for the deliveries whose lease is due, which
// restarts JetStream's AckWait, then a flush: only a flush confirmed
// before a delivery's lease lapsed moves its deadline. A later one proves
// nothing: its InProgress may have waited in the reconnect buffer while the
// server was out of reach and reached it after the AckWait, when it had
// redelivered the message. Past WithMaxExtension a delivery is no longer
// extended, and JetStream redelivers it.
func (s *Source) beat(time.Time) {
	var due []*unsettled.Entry[uint64, jetstream.Msg]
	for _, e := range s.live.Due(time.Now(), s.ackWait) {
		if s.live.Lapses(e).Before(e.Received.Add(s.c.maxExtension)) { // else at the cap: let it lapse
			due = append(due, e)
		}
	}
	if len(due) == 0 {
		return
	}
	sent := time.Now()
	var failed error
	for _, e := range due {
		if err := e.D.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			failed = err
		}
	}
	if failed == nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.ackWait/3)
		failed = s.link.nc.FlushWithContext(ctx)
		cancel()
	}
	if failed != nil {
		s.log().Warn("idemq nats: heartbeat failed; trying again next beat", "stream", s.c.stream, "consumer", s.c.consumer, "messages", len(due), "error", failed)
		return
	}
	confirmed := time.Now()
	kept := due[:0]
	for _, e := range due {
		if confirmed.Before(s.live.Lapses(e)) {
			kept = append(kept, e)
		}
	}
	if late := len(due) - len(kept); late > 0 {
		s.log().Warn("idemq nats: heartbeat confirmed after the lease lapsed; those deliveries are stale and JetStream redelivers them",
			"stream", s.c.stream, "consumer", s.c.consumer, "messages", late, "ack_wait", s.ackWait)
	}
	s.live.Extended(kept, sent)
}
