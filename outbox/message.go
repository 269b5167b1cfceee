package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemq/idemq/core/driver"
)

// MaxIDLength is the longest message id Write accepts, in bytes; the id
// column is that wide.
const MaxIDLength = 255

// MaxKeyLength is the longest ordering key Write accepts, in bytes.
const MaxKeyLength = 255

// MaxDestinationLength is the longest destination Write accepts, in bytes.
const MaxDestinationLength = 255

// Message is one message to publish, as Write stores it.
type Message struct {
	// ID is the message's business id. Empty: Write assigns a UUIDv7 and
	// sets it here, so the caller can log or return it.
	ID string
	// Destination is where the relay publishes the message: a queue or
	// routing key (RabbitMQ), a topic (Kafka), a queue (SQS, memory).
	// Required.
	Destination string
	// Key is the ordering key: messages with the same key are published in
	// commit order. Empty: no ordering with other messages. It is also
	// passed on as driver.Message.Key (Kafka key, SQS MessageGroupId).
	Key string
	// Headers are sent as message headers. Write adds the trace context
	// of its ctx through OpenTelemetry's global propagator, which sends
	// nothing until one is installed: tracing.InstallPropagator installs
	// W3C traceparent and baggage.
	Headers map[string]string
	// Body is the payload.
	Body []byte
}

// Prepare validates m, assigns a UUIDv7 id when m.ID is empty, and returns
// the headers to store: a copy of m.Headers with the trace context of ctx
// injected by the global propagator. Store packages call it from Write.
func Prepare(ctx context.Context, m *Message) (map[string]string, error) {
	if m == nil {
		return nil, errors.New("outbox: nil message")
	}
	switch {
	case m.Destination == "":
		return nil, errors.New("outbox: Message.Destination is empty")
	case len(m.Destination) > MaxDestinationLength:
		return nil, fmt.Errorf("outbox: Message.Destination is %d bytes, at most %d allowed", len(m.Destination), MaxDestinationLength)
	case len(m.Key) > MaxKeyLength:
		return nil, fmt.Errorf("outbox: Message.Key is %d bytes, at most %d allowed", len(m.Key), MaxKeyLength)
	case len(m.ID) > MaxIDLength:
		return nil, fmt.Errorf("outbox: Message.ID is %d bytes, at most %d allowed", len(m.ID), MaxIDLength)
	}
	if m.ID == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("outbox: generating a UUIDv7: %w", err)
		}
		m.ID = id.String()
	}
	h := maps.Clone(m.Headers)
	if h == nil {
		h = make(map[string]string, 2)
	}
	otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(h))
	return h, nil
}

// Row is one outbox row as a Store hands it to the Relay.
type Row struct {
	// Seq orders the rows: per key, it is the commit order.
	Seq int64
	// ID, Destination, Key, Headers and Body are as written.
	ID          string
	Destination string
	Key         string
	Headers     map[string]string
	Body        []byte
	// CreatedAt is when the row was written (database clock).
	CreatedAt time.Time
	// Attempts counts earlier publishes of the row that failed.
	Attempts int
}

// coreMessage is the message the relay publishes for r.
func (r *Row) coreMessage() *driver.Message {
	return &driver.Message{ID: r.ID, Key: r.Key, Headers: r.Headers, Body: r.Body}
}

// PublisherFunc adapts a function to a driver.Publisher for the relay; its
// Close does nothing.
type PublisherFunc func(ctx context.Context, destination string, msgs ...*driver.Message) error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, destination string, msgs ...*driver.Message) error {
	return f(ctx, destination, msgs...)
}

// Close implements driver.Publisher; it does nothing.
func (f PublisherFunc) Close() error { return nil }

// Destinations returns a driver.Publisher that sends each destination's
// messages through its own publisher, to that publisher's default
// destination: for publishers opened by URL (core.OpenPublisher), one per
// destination. A destination missing from the map fails the publish (the
// rows stay pending and are retried), naming it. Its Close does nothing:
// the publishers stay the caller's to close.
func Destinations(pubs map[string]driver.Publisher) driver.Publisher {
	pubs = maps.Clone(pubs)
	return PublisherFunc(func(ctx context.Context, destination string, msgs ...*driver.Message) error {
		p, ok := pubs[destination]
		if !ok {
			return fmt.Errorf("outbox: no publisher for destination %q", destination)
		}
		return p.Publish(ctx, "", msgs...)
	})
}
