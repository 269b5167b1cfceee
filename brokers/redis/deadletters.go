package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
)

// DeadLetters is an operator's handle on a stream's dead letters: the
// entries of its dead-letter stream, which every group of the stream parks
// to unless WithDeadLetterStream gives each its own. It implements
// admin.DeadLetterQueue. Scan reads them with XRANGE, so listing leaves
// them parked; Ref is the dead letter's entry id.
type DeadLetters struct {
	*link
}

// OpenDeadLetters opens the dead letters of stream at addr (host:port),
// in the dead-letter stream a Source of the same options parks to.
func OpenDeadLetters(ctx context.Context, addr, stream string, opts ...Option) (*DeadLetters, error) {
	l, err := connect(ctx, addr, stream, false, opts)
	if err != nil {
		return nil, err
	}
	return &DeadLetters{link: l}, nil
}

// Name implements admin.DeadLetterQueue: the dead-letter stream.
func (q *DeadLetters) Name() string { return q.c.dlq }

// Close implements admin.DeadLetterQueue.
func (q *DeadLetters) Close() error { return q.close() }

// Scan implements admin.DeadLetterQueue, oldest first: the dead letters up
// to the last one at the call's start, a hundred per XRANGE.
func (q *DeadLetters) Scan(ctx context.Context, fn func(*admin.Parked) error) error {
	last, err := q.rdb.XRevRangeN(ctx, q.c.dlq, "+", "-", 1).Result()
	if err != nil || len(last) == 0 {
		return q.wrap("reading", err)
	}
	for from := "-"; ; {
		page, err := q.rdb.XRangeN(ctx, q.c.dlq, from, last[0].ID, 100).Result()
		if err != nil {
			return q.wrap("reading", err)
		}
		for _, m := range page {
			if err := fn(q.parked(m)); err != nil {
				return err
			}
		}
		if len(page) < 100 {
			return nil
		}
		from = "(" + page[len(page)-1].ID
	}
}

func (q *DeadLetters) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("redis: %s the dead-letter stream %s: %w", what, q.c.dlq, err)
}

// parked reads a dead letter.
func (q *DeadLetters) parked(x goredis.XMessage) *admin.Parked {
	m, _ := message(q.c.idField, x.Values)
	h := m.Headers
	p := &admin.Parked{Ref: x.ID, ID: m.ID, Key: m.Key, Body: m.Body, Headers: h, Cause: h[driver.CauseHeader],
		Origin: h[driver.OriginHeader], Destination: h[driver.DestinationHeader], ParkedAt: entryTime(x.ID)}
	p.Attempt, _ = strconv.Atoi(h[driver.AttemptHeader])
	if t, err := time.Parse(time.RFC3339Nano, h[driver.ParkedAtHeader]); err == nil && t.Before(p.ParkedAt) {
		p.ParkedAt = t
	}
	return p
}

// Redrive implements admin.DeadLetterQueue: each chosen dead letter is
// added (XADD) to the stream it was consumed from with its fields minus
// the bookkeeping ones, a new entry whose delivery count starts again,
// and deleted from the dead-letter stream (XDEL) only after the XADD.
// Every group of that stream reads the copy; those that applied it decide
// it Duplicate.
func (q *DeadLetters) Redrive(ctx context.Context, sel func(*admin.Parked) bool, progress func(done int)) (int, error) {
	var all []*admin.Parked
	if err := q.Scan(ctx, func(p *admin.Parked) error {
		if sel == nil || sel(p) {
			all = append(all, p)
		}
		return nil
	}); err != nil {
		return 0, err
	}
	for i, p := range all {
		if p.Destination == "" {
			return i, fmt.Errorf("redis: dead letter %s has no %s field to redrive it to", p.Ref, driver.DestinationHeader)
		}
		if err := q.xadd(ctx, nil, p.Destination, q.fields(p.Headers, p.ID, p.Key, p.Body)).Err(); err != nil {
			return i, fmt.Errorf("redis: redriving dead letter %s to %s: %w", p.Ref, p.Destination, err)
		}
		if err := q.rdb.XDel(ctx, q.c.dlq, p.Ref).Err(); err != nil {
			return i, q.wrap("removing redriven dead letter "+p.Ref+" from", err)
		}
		if progress != nil {
			progress(i + 1)
		}
	}
	return len(all), nil
}

// Purge implements admin.DeadLetterQueue with XDEL.
func (q *DeadLetters) Purge(ctx context.Context, sel func(*admin.Parked) bool) (int, error) {
	n := 0
	err := q.Scan(ctx, func(p *admin.Parked) error {
		if sel != nil && !sel(p) {
			return nil
		}
		if err := q.rdb.XDel(ctx, q.c.dlq, p.Ref).Err(); err != nil {
			return q.wrap("purging "+p.Ref+" from", err)
		}
		n++
		return nil
	})
	return n, err
}
