package redis

import (
	"context"
	"fmt"
	"maps"

	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemq/idemq/core/driver"
)

// Publisher adds messages to a stream (XADD) with the business id in the
// id field (WithIDField), the key in idemq-key, the body in body, and the
// headers, with the caller's W3C trace context injected by the global
// OpenTelemetry propagator, as fields of their own. It implements
// driver.Publisher and is safe for concurrent use.
type Publisher struct {
	*link
	stream string
}

// NewPublisher connects to addr (host:port) for adding to stream. The
// stream is created by its first entry.
func NewPublisher(ctx context.Context, addr, stream string, opts ...Option) (*Publisher, error) {
	l, err := connect(ctx, addr, stream, false, opts)
	if err != nil {
		return nil, err
	}
	return &Publisher{link: l, stream: stream}, nil
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
	cmds := make([]*goredis.StringCmd, len(msgs))
	for i, m := range msgs {
		h := maps.Clone(m.Headers)
		if h == nil {
			h = map[string]string{}
		}
		maps.Copy(h, trace)
		cmds[i] = p.xadd(ctx, pipe, destination, p.fields(h, m.ID, m.Key, m.Body))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		for i, c := range cmds {
			if c.Err() != nil {
				return fmt.Errorf("redis: adding %q to %s: %w", msgs[i].ID, destination, c.Err())
			}
		}
		return fmt.Errorf("redis: adding to %s: %w", destination, err)
	}
	return nil
}

// Close implements driver.Publisher: it closes the client (unless it came
// from WithClient).
func (p *Publisher) Close() error { return p.close() }
