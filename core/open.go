package core

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"reflect"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/registry"
)

// OpenOption configures what OpenSource and OpenPublisher open, beside the
// URL.
type OpenOption func(*driver.OpenConfig)

// WithAdapterLogger makes the opened source or publisher log to l
// (reconnects, receive errors, failed settlements). Default: a source logs
// to the Consumer's logger (WithLogger) once a Consumer runs it, and to
// slog.Default() before that.
func WithAdapterLogger(l *slog.Logger) OpenOption {
	return func(c *driver.OpenConfig) { c.Logger = l }
}

func openConfig(opts []OpenOption) driver.OpenConfig {
	var cfg driver.OpenConfig
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// OpenSource opens the broker adapter registered for rawURL's scheme
// (amqp://, kafka://, sqs://, nats://, mem://, …; import the adapter's
// package to register it). The Consumer takes the source; Run closes it.
// Errors never contain credentials.
func OpenSource(ctx context.Context, rawURL string, opts ...OpenOption) (driver.Source, error) {
	cfg := openConfig(opts)
	src, _, err := registry.Open(registry.Sources, rawURL, "broker", func(o any, u *url.URL) (driver.Source, error) {
		return o.(driver.SourceOpener)(ctx, u, cfg)
	})
	return src, err
}

// OpenStore opens the store registered for rawURL's scheme (postgres://,
// mysql://, sqlite://, …) and checks that its handlers take transactions of
// type Tx: pgx.Tx for Postgres, *sql.Tx for MySQL and SQLite. The store's
// Close releases it and As hands out its pool. Errors never contain
// credentials.
func OpenStore[Tx any](ctx context.Context, rawURL string) (driver.Store[Tx], error) {
	s, u, err := registry.Open(registry.Stores, rawURL, "store", func(o any, u *url.URL) (any, error) {
		return o.(driver.StoreOpener)(ctx, u)
	})
	if err != nil {
		return nil, err
	}
	store, ok := s.(driver.Store[Tx])
	if !ok {
		if c, ok := s.(interface{ Close() error }); ok {
			c.Close()
		}
		return nil, fmt.Errorf("idemq: store %s:// gives handlers a %s, not a %s", u.Scheme, txTypeOf(s), reflect.TypeFor[Tx]())
	}
	return store, nil
}

func txTypeOf(s any) string {
	m, ok := reflect.TypeOf(s).MethodByName("Begin")
	if !ok || m.Type.NumOut() == 0 {
		return "different transaction type"
	}
	txn := m.Type.Out(0)
	if tm, ok := txn.MethodByName("Tx"); ok && tm.Type.NumOut() == 1 {
		return tm.Type.Out(0).String()
	}
	return "different transaction type"
}

// Publisher sends messages to a broker, each with its business id where
// the broker carries it and the caller's trace context in its headers.
type Publisher struct {
	p driver.Publisher
}

// OpenPublisher opens a publisher for rawURL's broker and destination (the
// URL a source of the same queue or topic is opened with). Errors never
// contain credentials.
func OpenPublisher(ctx context.Context, rawURL string, opts ...OpenOption) (*Publisher, error) {
	cfg := openConfig(opts)
	p, _, err := registry.Open(registry.Publishers, rawURL, "publisher", func(o any, u *url.URL) (driver.Publisher, error) {
		return o.(driver.PublisherOpener)(ctx, u, cfg)
	})
	if err != nil {
		return nil, err
	}
	return &Publisher{p: p}, nil
}

// NewPublisher wraps a broker adapter's publisher (rabbitmq.NewPublisher,
// kafka.NewPublisher, …).
func NewPublisher(p driver.Publisher) *Publisher { return &Publisher{p: p} }

// Publish sends msgs to destination (a queue, topic, subject or routing key
// in the broker's terms) or, when destination is "", to the destination
// the Publisher was opened for. It returns only after the broker confirmed
// every message. An error marked Permanent is one no retry can change (no
// queue bound, a message too large). A *driver.Partial says which
// messages the broker took and which it refused, for a caller that sends
// again only the refused ones.
func (p *Publisher) Publish(ctx context.Context, destination string, msgs ...*Message) error {
	vals := make([]driver.Message, len(msgs))
	dm := make([]*driver.Message, len(msgs))
	for i, m := range msgs {
		vals[i] = driver.Message{ID: m.ID, Body: m.Body, Headers: m.Headers, Key: m.Key, Source: m.Source,
			System: m.System, Attempt: m.Attempt, Metadata: m.Metadata, ReceivedAt: m.ReceivedAt}
		dm[i] = &vals[i]
	}
	return p.p.Publish(ctx, destination, dm...)
}

// Close releases the Publisher's connections.
func (p *Publisher) Close() error { return p.p.Close() }

// Driver returns the adapter's publisher, for what works in the driver's
// terms: the outbox relay (outbox.NewRelay) takes it.
func (p *Publisher) Driver() driver.Publisher { return p.p }

// Redact returns rawURL with its password and any secret-looking query
// parameter (password, secret, token, key, sasl…) replaced by "xxxxx", for
// logs and errors. It works on URLs that do not parse, too: then it hides
// everything from the first ':' after the user name to the last '@', more
// than the password, never less.
func Redact(rawURL string) string { return redact.URL(rawURL) }

// RedactError returns err's text with every secret of rawURL (its password
// and secret query values, as written, unescaped and escaped) replaced by
// "xxxxx", for drivers whose errors quote the URL they were given.
func RedactError(err error, rawURL string) string { return redact.Error(err, rawURL) }
