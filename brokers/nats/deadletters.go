package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
)

// legacySubjectHeader named the subject to redrive to on copies parked
// before the adapter wrote driver.DestinationHeader.
const legacySubjectHeader = "idemq-subject"

// DeadLetters is an operator's handle on one consumer's dead letters, the
// messages on its dead-letter subject: a driver.DeadLetters and
// driver.Redriver.
type DeadLetters struct{ *deadletter.Queue[uint64] }

// OpenDeadLetters opens the dead letters of the consumer of addr, a
// nats:// URL as the Source's, in the dead-letter stream and subject the
// Source uses (WithDeadLetterStream, WithDeadLetterSubject). The
// dead-letter stream must exist: a Source with WithDeclare(true) creates it.
func OpenDeadLetters(ctx context.Context, addr string, opts ...Option) (*DeadLetters, error) {
	c, l, err := connect(addr, true, false, opts)
	if err != nil {
		return nil, err
	}
	dlq, err := l.stream(ctx, c.dlqStream, c.dlqSubject, "dead-letter stream", false, true)
	if err != nil {
		l.close()
		return nil, err
	}
	return &DeadLetters{deadletter.New[uint64](&parked{c: c, link: l, dlq: dlq})}, nil
}

// parked is the dead-letter stream as deadletter.Queue needs it.
type parked struct {
	c    config
	link *link
	dlq  jetstream.Stream
}

// Name is the dead-letter stream and subject, as STREAM/SUBJECT.
func (q *parked) Name() string { return q.c.dlqStream + "/" + q.c.dlqSubject }

func (q *parked) Close() error { return q.link.close() }

// Each reads the copies on the dead-letter subject with next-by-subject
// direct gets, up to the last sequence at the call's start.
func (q *parked) Each(ctx context.Context, fn func(seq uint64, p *driver.Parked) error) error {
	info, err := q.dlq.Info(ctx)
	if err != nil {
		return fmt.Errorf("nats: dead-letter stream %s: %w", q.c.dlqStream, err)
	}
	last := info.State.LastSeq
	for seq := info.State.FirstSeq; seq > 0 && seq <= last; seq++ {
		raw, err := q.dlq.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(q.c.dlqSubject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("nats: reading the dead-letter stream %s at %d: %w", q.c.dlqStream, seq, err)
		}
		if seq = raw.Sequence; seq > last {
			return nil
		}
		h := headerMap(raw.Header)
		delete(h, natsgo.MsgIdHdr) // the parking's own dedup id
		p := &driver.Parked{Ref: strconv.FormatUint(seq, 10), ID: h[IDHeader], ParkedAt: raw.Time, Key: h[KeyHeader], Headers: h, Body: raw.Data}
		deadletter.Read(p)
		if p.Destination == "" {
			p.Destination = h[legacySubjectHeader]
		}
		if err := fn(seq, p); err != nil {
			return err
		}
	}
	return nil
}

// Republish publishes the copy with the id in idemq-id and a Nats-Msg-Id
// of its dead-letter sequence: JetStream would drop the original's within
// the duplicate window, and drops a redrive repeated after a failed delete.
func (q *parked) Republish(ctx context.Context, seq uint64, p *driver.Parked) error {
	h := natsgo.Header{}
	for k, v := range p.Headers {
		if k != legacySubjectHeader {
			h.Set(k, v)
		}
	}
	if p.ID != "" {
		h.Set(IDHeader, p.ID)
		h.Set(natsgo.MsgIdHdr, fmt.Sprintf("idemq-redrive:%s:%d", q.c.dlqStream, seq))
	}
	_, err := q.link.js.PublishMsg(ctx, &natsgo.Msg{Subject: p.Destination, Header: h, Data: p.Body})
	return err
}

// Remove deletes the copy by sequence.
func (q *parked) Remove(ctx context.Context, seq uint64) error { return q.dlq.DeleteMsg(ctx, seq) }
