package core

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/redact"
)

// Message is one received message as handlers and observers see it,
// whatever broker it came from.
type Message = driver.Message

// Source is a broker's stream of deliveries, as OpenSource or an adapter's
// constructor returns it; the Consumer takes it.
type Source = driver.Source

// Store is a dedup store, as OpenStore or a store's constructor returns it:
// the Consumer takes it, Close releases it, and As hands out its pool.
type Store[Tx any] = driver.Store[Tx]

// Publisher sends messages to a broker with their ids and trace context;
// Publish with destination "" sends to the destination it was opened for.
type Publisher = driver.Publisher

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
// (amqp://, kafka://, sqs://, mem://, …). Errors never contain credentials.
func OpenSource(ctx context.Context, rawURL string, opts ...OpenOption) (Source, error) {
	return driver.OpenSource(ctx, rawURL, openConfig(opts))
}

// OpenPublisher opens a publisher for rawURL's broker and destination.
// Errors never contain credentials.
func OpenPublisher(ctx context.Context, rawURL string, opts ...OpenOption) (Publisher, error) {
	return driver.OpenPublisher(ctx, rawURL, openConfig(opts))
}

// DeadLetterQueue is an operator's handle on a consumer's dead letters:
// Scan, Redrive and Purge, as the idemq command's dlq subcommands use it.
type DeadLetterQueue = driver.DeadLetterQueue

// Parked is one dead-lettered message, as DeadLetterQueue.Scan reports it.
type Parked = driver.Parked

// OpenDeadLetters opens the dead-letter queue of the consumer rawURL
// describes (the URL its source is opened with), so a service can list,
// redrive and purge its dead letters itself. Errors never contain
// credentials.
func OpenDeadLetters(ctx context.Context, rawURL string, opts ...OpenOption) (DeadLetterQueue, error) {
	return driver.OpenDeadLetters(ctx, rawURL, openConfig(opts))
}

// OpenStore opens the store registered for rawURL's scheme (postgres://,
// mysql://, sqlite://, …) and checks that its handlers take transactions of
// type Tx: pgx.Tx for Postgres, *sql.Tx for MySQL and SQLite. Errors never
// contain credentials.
func OpenStore[Tx any](ctx context.Context, rawURL string) (Store[Tx], error) {
	s, err := driver.OpenStore(ctx, rawURL)
	if err != nil {
		return nil, err
	}
	store, ok := s.(Store[Tx])
	if !ok {
		s.Close()
		u, _ := redact.ParseURL(rawURL)
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
