package redis

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
)

// Publisher adds messages to a stream (XADD): the id in the id field, the
// key in idemq-key, the body in body, and each header, W3C trace context
// from the global propagator included, in a field of its own. It
// implements driver.Publisher and is safe for concurrent use.
type Publisher struct{ *link }

// NewPublisher connects to addr (host:port) to add to stream.
func NewPublisher(ctx context.Context, addr, stream string, opts ...Option) (*Publisher, error) {
	l, err := connect(ctx, addr, stream, false, opts)
	if err != nil {
		return nil, err
	}
	return &Publisher{l}, nil
}

// Publish implements driver.Publisher: it adds msgs to destination (a
// stream), or to the Publisher's stream when destination is "", in one
// pipeline, and returns once Redis answered every XADD.
func (p *Publisher) Publish(ctx context.Context, destination string, msgs ...*driver.Message) error {
	if destination == "" {
		destination = p.stream
	}
	trace := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, trace)
	pipe := p.rdb.Pipeline()
	for _, m := range msgs {
		h := map[string]string{}
		maps.Copy(h, m.Headers)
		maps.Copy(h, trace)
		p.xadd(ctx, pipe, destination, p.fields(h, m.ID, m.Key, m.Body))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("redis: adding %d messages to %s: %w", len(msgs), destination, err)
	}
	return nil
}

// Close implements driver.Publisher.
func (p *Publisher) Close() error { return p.rdb.Close() }

// DeadLetters is an operator's handle on the entries of a stream's
// dead-letter stream, which the stream's groups share unless
// WithDeadLetterStream parts them. It implements admin.DeadLetterQueue;
// Ref is the dead letter's entry id.
type DeadLetters struct{ *link }

// OpenDeadLetters opens the dead letters a Source of stream parks.
func OpenDeadLetters(ctx context.Context, addr, stream string, opts ...Option) (*DeadLetters, error) {
	l, err := connect(ctx, addr, stream, false, opts)
	if err != nil {
		return nil, err
	}
	return &DeadLetters{l}, nil
}

// Name implements admin.DeadLetterQueue: the dead-letter stream.
func (q *DeadLetters) Name() string { return q.c.dlq }

// Close implements admin.DeadLetterQueue.
func (q *DeadLetters) Close() error { return q.rdb.Close() }

// Scan implements admin.DeadLetterQueue, oldest first, with XRANGE.
func (q *DeadLetters) Scan(ctx context.Context, fn func(*admin.Parked) error) error {
	last, err := q.rdb.XRevRangeN(ctx, q.c.dlq, "+", "-", 1).Result()
	for from := "-"; err == nil && len(last) == 1; {
		var page []goredis.XMessage
		if page, err = q.rdb.XRangeN(ctx, q.c.dlq, from, last[0].ID, 100).Result(); err != nil {
			break
		}
		for _, x := range page {
			if err := fn(q.parked(x)); err != nil {
				return err
			}
		}
		if len(page) < 100 {
			return nil
		}
		from = "(" + page[len(page)-1].ID
	}
	return q.failed("reading", err)
}

func (q *DeadLetters) failed(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("redis: %s the dead-letter stream %s: %w", what, q.c.dlq, err)
}

// parked reads a dead letter, parked at its entry id's time.
func (q *DeadLetters) parked(x goredis.XMessage) *admin.Parked {
	m := message(q.c.idField, x.Values)
	h := m.Headers
	ms, _ := strconv.ParseInt(strings.SplitN(x.ID, "-", 2)[0], 10, 64)
	p := &admin.Parked{Ref: x.ID, ID: m.ID, Key: m.Key, Body: m.Body, Headers: h, Cause: h[driver.CauseHeader],
		Origin: h[driver.OriginHeader], Destination: h[driver.DestinationHeader], ParkedAt: time.UnixMilli(ms)}
	p.Attempt, _ = strconv.Atoi(h[driver.AttemptHeader])
	return p
}

// Redrive implements admin.DeadLetterQueue: a chosen dead letter is added
// (XADD) to the stream it came from without the bookkeeping fields, a new
// entry read by every group of the stream, and deleted (XDEL) after that.
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
		if err := q.xadd(ctx, q.rdb, p.Destination, q.fields(p.Headers, p.ID, p.Key, p.Body)).Err(); err != nil {
			return i, fmt.Errorf("redis: redriving dead letter %s to %s: %w", p.Ref, p.Destination, err)
		}
		if err := q.rdb.XDel(ctx, q.c.dlq, p.Ref).Err(); err != nil {
			return i, q.failed("removing redriven "+p.Ref+" from", err)
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
		err := q.rdb.XDel(ctx, q.c.dlq, p.Ref).Err()
		if err == nil {
			n++
		}
		return q.failed("purging "+p.Ref+" from", err)
	})
	return n, err
}
