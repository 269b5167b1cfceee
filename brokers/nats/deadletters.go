package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
)

// bookkeeping are the headers a parked copy carries beside the message's
// own; Redrive leaves them out.
var bookkeeping = []string{driver.CauseHeader, driver.AttemptHeader, driver.OriginHeader, driver.ParkedAtHeader, driver.DestinationHeader}

// DeadLetters is an operator's handle on one consumer's dead letters: the
// messages on its dead-letter subject in the dead-letter stream. It
// implements admin.DeadLetterQueue. Scan reads them by sequence (direct
// gets, never a consumer), so listing leaves them parked; Redrive and Purge
// delete them by sequence.
type DeadLetters struct {
	c    config
	link *link
	dlq  jetstream.Stream
}

// OpenDeadLetters opens the dead letters of the consumer of addr, a
// nats:// URL as the Source's, in the dead-letter stream and subject the
// Source uses (WithDeadLetterStream, WithDeadLetterSubject). The
// dead-letter stream must exist: a Source with WithDeclare(true) creates it.
func OpenDeadLetters(ctx context.Context, addr string, opts ...Option) (*DeadLetters, error) {
	c, l, err := connect(addr, true, opts, nil)
	if err != nil {
		return nil, err
	}
	dlq, err := l.stream(ctx, c.dlqStream, c.dlqSubject, "dead-letter stream", false, true)
	if err != nil {
		l.close()
		return nil, err
	}
	return &DeadLetters{c: c, link: l, dlq: dlq}, nil
}

// Name implements admin.DeadLetterQueue: the dead-letter stream and
// subject, as STREAM/SUBJECT.
func (q *DeadLetters) Name() string { return q.c.dlqStream + "/" + q.c.dlqSubject }

// Close implements admin.DeadLetterQueue.
func (q *DeadLetters) Close() error {
	q.link.close()
	return nil
}

// Scan implements admin.DeadLetterQueue, oldest first.
func (q *DeadLetters) Scan(ctx context.Context, fn func(*admin.Parked) error) error {
	return q.each(ctx, func(_ uint64, p *admin.Parked) error { return fn(p) })
}

// each calls fn with each parked message from the first sequence to the
// last one at the call's start.
func (q *DeadLetters) each(ctx context.Context, fn func(seq uint64, p *admin.Parked) error) error {
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
		if raw.Sequence > last {
			return nil
		}
		seq = raw.Sequence
		if err := fn(seq, parked(raw)); err != nil {
			return err
		}
	}
	return nil
}

// parked reads a parked copy.
func parked(raw *jetstream.RawStreamMsg) *admin.Parked {
	h := headerMap(raw.Header)
	delete(h, natsgo.MsgIdHdr) // the parking's own dedup id
	p := &admin.Parked{
		Ref:         strconv.FormatUint(raw.Sequence, 10),
		ID:          h[IDHeader],
		Cause:       h[driver.CauseHeader],
		Origin:      h[driver.OriginHeader],
		Destination: h[driver.DestinationHeader],
		ParkedAt:    raw.Time,
		Key:         h[KeyHeader],
		Headers:     h,
		Body:        raw.Data,
	}
	p.Attempt, _ = strconv.Atoi(h[driver.AttemptHeader])
	if t, err := time.Parse(time.RFC3339Nano, h[driver.ParkedAtHeader]); err == nil && t.Before(raw.Time) {
		p.ParkedAt = t
	}
	return p
}

// Redrive implements admin.DeadLetterQueue. The copy goes to the subject
// the message was consumed from, with its headers minus the bookkeeping
// ones, and its business id in idemq-id, which the Source reads before the
// id header: JetStream would drop a publish with the original Nats-Msg-Id
// within the stream's duplicate window, so the copy's Nats-Msg-Id is
// derived from its place in the dead-letter stream instead (a Redrive
// repeated after a failed delete is then dropped as a duplicate). Every
// consumer of that subject gets the copy again; those that applied it
// decide it Duplicate.
func (q *DeadLetters) Redrive(ctx context.Context, sel func(*admin.Parked) bool, progress func(done int)) (int, error) {
	type chosen struct {
		seq uint64
		p   *admin.Parked
	}
	var all []chosen
	err := q.each(ctx, func(seq uint64, p *admin.Parked) error {
		if sel == nil || sel(p) {
			all = append(all, chosen{seq, p})
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for i, c := range all {
		if c.p.Destination == "" {
			return i, fmt.Errorf("nats: dead letter %d has no %s header to redrive it to", c.seq, driver.DestinationHeader)
		}
		h := natsgo.Header{}
		for k, v := range c.p.Headers {
			h.Set(k, v)
		}
		for _, k := range bookkeeping {
			h.Del(k)
		}
		if c.p.ID != "" {
			h.Set(IDHeader, c.p.ID)
			h.Set(natsgo.MsgIdHdr, fmt.Sprintf("idemq-redrive:%s:%d", q.c.dlqStream, c.seq))
		}
		if _, err := q.link.js.PublishMsg(ctx, &natsgo.Msg{Subject: c.p.Destination, Header: h, Data: c.p.Body}); err != nil {
			return i, fmt.Errorf("nats: redriving dead letter %d to %s: %w", c.seq, c.p.Destination, err)
		}
		if err := q.dlq.DeleteMsg(ctx, c.seq); err != nil {
			return i, fmt.Errorf("nats: removing redriven dead letter %d: %w", c.seq, err)
		}
		if progress != nil {
			progress(i + 1)
		}
	}
	return len(all), nil
}

// Purge implements admin.DeadLetterQueue.
func (q *DeadLetters) Purge(ctx context.Context, sel func(*admin.Parked) bool) (int, error) {
	n := 0
	err := q.each(ctx, func(seq uint64, p *admin.Parked) error {
		if sel != nil && !sel(p) {
			return nil
		}
		if err := q.dlq.DeleteMsg(ctx, seq); err != nil {
			return fmt.Errorf("nats: purging dead letter %d: %w", seq, err)
		}
		n++
		return nil
	})
	return n, err
}
