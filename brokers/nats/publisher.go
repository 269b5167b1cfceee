package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	natsgo "github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemq/idemq/core/driver"
)

// Publisher publishes to JetStream with the business id in Nats-Msg-Id
// (JetStream drops a second publish of an id within the duplicate window)
// and the WithIDHeader header, the key in idemq-key and the W3C trace
// context of the global OpenTelemetry propagator. It implements
// driver.Publisher and is safe for concurrent use.
type Publisher struct {
	c    config
	link *link
}

// NewPublisher connects for publishing to the subject of addr, a nats://
// URL as the Source's (whose consumer parameters it checks and ignores).
// With WithDeclare(true), the default, it creates a missing stream, so
// messages published before any consumer exists are kept.
func NewPublisher(ctx context.Context, addr string, opts ...PublisherOption) (*Publisher, error) {
	c, l, err := connect(addr, false, false, opts)
	if err != nil {
		return nil, err
	}
	if _, err := l.stream(ctx, c.stream, c.subject, "stream", c.declare, false); err != nil {
		l.close()
		return nil, err
	}
	return &Publisher{c: c, link: l}, nil
}

// Publish implements driver.Publisher: it publishes msgs to destination
// (a subject), or to the Publisher's subject when destination is "",
// asynchronously, and returns once JetStream acked every one. A publish
// JetStream reports as a duplicate counts as acked: the stream has the id.
func (p *Publisher) Publish(ctx context.Context, destination string, msgs ...*driver.Message) error {
	subj := cmp.Or(destination, p.c.subject)
	if strings.ContainsAny(subj, "*>") {
		return fmt.Errorf("nats: cannot publish to the wildcard subject %s; give a destination", subj)
	}
	trace := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, trace)
	out := make([]*natsgo.Msg, len(msgs))
	for i, m := range msgs {
		h := natsgo.Header{}
		for k, v := range m.Headers {
			h.Set(k, oneLine.Replace(v))
		}
		for k, v := range trace {
			h.Set(k, v)
		}
		if m.ID != "" {
			h.Set(natsgo.MsgIdHdr, m.ID)
			h.Set(p.c.idHeader, m.ID)
		}
		if m.Key != "" {
			h.Set(KeyHeader, m.Key)
		}
		out[i] = &natsgo.Msg{Subject: subj, Header: h, Data: m.Body}
	}
	for i, err := range p.link.publish(ctx, out) {
		if err != nil {
			return fmt.Errorf("nats: publishing %q to %s: %w", msgs[i].ID, subj, err)
		}
	}
	return nil
}

// Close implements driver.Publisher: it closes the connection (unless it
// came from WithConn).
func (p *Publisher) Close() error {
	if !p.link.own || p.link.nc.IsClosed() {
		return nil
	}
	if err := p.link.shut(); err != nil && !errors.Is(err, natsgo.ErrConnectionClosed) {
		return fmt.Errorf("nats: closing the publisher: %w", err)
	}
	return nil
}

// oneLine makes a string fit a NATS header value.
var oneLine = strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ")
