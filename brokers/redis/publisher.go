package redis

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
)

// Publisher adds messages to a stream (XADD): the id in the id field, the
// key in idemq-key, the body in the body field, and each header, W3C
// trace context from the global propagator included, in a field of its
// own. It implements driver.Publisher and is safe for concurrent use.
type Publisher struct{ *link }

// PublisherOption configures a Publisher beyond its URL.
type PublisherOption func(*config) error

// WithPublisherTLS dials the Publisher with TLS configured by tc.
func WithPublisherTLS(tc *tls.Config) PublisherOption { return PublisherOption(WithTLS(tc)) }

// NewPublisher connects to the redis:// or rediss:// URL addr to add to
// its stream. Of the URL's parameters, id_field, body_field, max_len and
// max_age apply; the others are checked and ignored.
func NewPublisher(ctx context.Context, addr string, opts ...PublisherOption) (*Publisher, error) {
	o := make([]Option, len(opts))
	for i, f := range opts {
		o[i] = Option(f)
	}
	l, err := connect(ctx, addr, false, o)
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
		body := m.Body
		if body == nil { // an entry without a body field would be dead-lettered
			body = []byte{}
		}
		p.xadd(ctx, pipe, destination, p.fields(h, m.ID, m.Key, body, nil))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("redis: adding %d messages to %s: %w", len(msgs), destination, err)
	}
	return nil
}

// Close implements driver.Publisher.
func (p *Publisher) Close() error { return p.close() }

// DeadLetters is an operator's handle on the entries of a stream's
// dead-letter stream, which the stream's groups share unless
// WithDeadLetterStream parts them. It implements driver.DeadLetters and
// driver.Redriver; Ref is the dead letter's entry id. Redrive adds a copy (XADD) to the
// stream it came from, a new entry every group of the stream reads, then
// deletes the dead letter (XDEL).
type DeadLetters struct{ *deadletter.Queue[string] }

// OpenDeadLetters opens the dead letters a Source opened with the same
// URL and options parks.
func OpenDeadLetters(ctx context.Context, addr string, opts ...Option) (*DeadLetters, error) {
	l, err := connect(ctx, addr, false, opts)
	if err != nil {
		return nil, err
	}
	return &DeadLetters{deadletter.New[string](dlqStore{l})}, nil
}

// dlqStore is the dead-letter stream as deadletter.Queue reads it.
type dlqStore struct{ *link }

func (q dlqStore) Name() string { return q.c.dlq }
func (q dlqStore) Close() error { return q.close() }

// Each reads the stream with XRANGE, oldest first, up to the entry last
// when it began.
func (q dlqStore) Each(ctx context.Context, fn func(string, *driver.Parked) error) error {
	last, err := q.rdb.XRevRangeN(ctx, q.c.dlq, "+", "-", 1).Result()
	for from := "-"; err == nil && len(last) == 1; {
		var page []goredis.XMessage
		if page, err = q.rdb.XRangeN(ctx, q.c.dlq, from, last[0].ID, 100).Result(); err != nil {
			break
		}
		for _, x := range page {
			m := q.message(x.Values)
			ms, _ := strconv.ParseInt(strings.SplitN(x.ID, "-", 2)[0], 10, 64)
			p := &driver.Parked{Ref: x.ID, ID: m.ID, Key: m.Key, Body: m.Body, Headers: m.Headers, ParkedAt: time.UnixMilli(ms)}
			deadletter.Read(p)
			if err := fn(x.ID, p); err != nil {
				return err
			}
		}
		if len(page) < 100 {
			return nil
		}
		from = "(" + page[len(page)-1].ID
	}
	if err != nil {
		return fmt.Errorf("redis: reading the dead-letter stream %s: %w", q.c.dlq, err)
	}
	return nil
}

func (q dlqStore) Republish(ctx context.Context, _ string, p *driver.Parked) error {
	return q.xadd(ctx, q.rdb, p.Destination, q.fields(p.Headers, p.ID, p.Key, p.Body, nil)).Err()
}

func (q dlqStore) Remove(ctx context.Context, ref string) error {
	return q.rdb.XDel(ctx, q.c.dlq, ref).Err()
}
