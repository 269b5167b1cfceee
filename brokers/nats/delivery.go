package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/unsettled"
)

// errRedelivered is the reason of a settlement of a delivery whose
// message the Source received again.
var errRedelivered = unsettled.ErrRedelivered

// delivery is one received message.
type delivery struct {
	e *unsettled.Entry[uint64, jetstream.Msg]
	s *Source
	m driver.Message
}

func (s *Source) newDelivery(msg jetstream.Msg) (*delivery, error) {
	md, err := msg.Metadata()
	if err != nil {
		_ = msg.Nak()
		return nil, fmt.Errorf("nats: a message without JetStream metadata on %s: %w", msg.Subject(), err)
	}
	now := time.Now()
	h := headerMap(msg.Headers())
	id, ok := h[IDHeader]
	if !ok {
		id = h[s.c.idHeader]
	}
	seq := strconv.FormatUint(md.Sequence.Stream, 10)
	return &delivery{
		s: s,
		m: driver.Message{
			ID:      id,
			Body:    msg.Data(),
			Headers: h,
			Key:     h[KeyHeader],
			Source:  msg.Subject(),
			System:  "nats",
			Attempt: int(md.NumDelivered),
			Metadata: map[string]string{
				"messaging.destination.name":       msg.Subject(),
				"messaging.consumer.group.name":    md.Consumer,
				"messaging.message.id":             h[natsgo.MsgIdHdr],
				"messaging.nats.stream":            md.Stream,
				"messaging.nats.stream_sequence":   seq,
				"messaging.nats.consumer_sequence": strconv.FormatUint(md.Sequence.Consumer, 10),
			},
			ReceivedAt: now,
		},
	}, nil
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

// begin claims the right to settle d and takes it out of the live set. It
// fails with ErrAlreadySettled, or with a stale error when the source was
// closed, the message was received again or the lease lapsed: then
// nothing may be sent.
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

// Ack implements driver.Delivery. It waits for the server's confirmation
// (a double ack): a fire-and-forget ack lost with a connection would go
// unreported, and although the redelivery would be decided Duplicate, the
// Consumer must learn that the message was not settled.
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
	var err error
	if delay > 0 {
		err = d.msg().NakWithDelay(delay)
	} else {
		err = d.msg().Nak()
	}
	if err == nil {
		err = d.s.flush(ctx)
	}
	if err != nil {
		return d.failed("nak", err)
	}
	return nil
}

// DeadLetter implements driver.Delivery: it publishes a copy of the
// message to the dead-letter subject with the cause, attempt, origin,
// parking time and original subject in headers, waits for JetStream's
// publish ack, and only then terminates the message (Term), so it is never
// dropped: if the publish fails the message is given back (Nak) and comes
// again. The copy's Nats-Msg-Id is derived from the stream sequence, so a
// message parked twice (its Term lost) is kept once.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	if err := d.begin(); err != nil {
		return err
	}
	s := d.s
	why := "no cause given"
	if cause != nil {
		why = cause.Error()
	}
	h := natsgo.Header{}
	for k, v := range d.msg().Headers() {
		if k != natsgo.MsgIdHdr {
			h[k] = v
		}
	}
	if d.m.ID != "" {
		h.Set(IDHeader, d.m.ID)
	}
	mark := deadletter.Mark{Cause: headerValue(why), Attempt: d.m.Attempt, Destination: d.msg().Subject(), At: time.Now(),
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
	if err := d.msg().Term(); err != nil {
		return d.failed("term after parking", err)
	}
	if err := s.flush(ctx); err != nil {
		return d.failed("term after parking", err)
	}
	return nil
}

// headerValue makes s fit a NATS header value: one line.
func headerValue(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
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

// beat keeps unsettled deliveries leased: every third of the AckWait it
// sends InProgress for each, which restarts JetStream's AckWait, then a
// flush; only a confirmed flush moves the deliveries' deadlines. A
// delivery held longer than WithMaxExtension since its receipt is no
// longer extended: JetStream then redelivers it, and the dedup key keeps
// its effect to one commit.
func (s *Source) beat(time.Time) {
	due := s.live.Due(time.Now(), s.ackWait)
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
	s.live.Extended(due, sent)
}
