package pgoutbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/outbox"
)

// postgresURL returns IDEMQ_POSTGRES_URL (default the local server);
// unreachable skips the test, or fails it with IDEMQ_REQUIRE_SERVICES=1.
func postgresURL(t testing.TB) string {
	t.Helper()
	return servicetest.PostgresURL(t)
}

func suffix() string {
	b := make([]byte, 5)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newPool connects to Postgres with the given application_name (so a test
// can terminate that pool's sessions) and closes the pool at the end.
func newPool(t testing.TB, url, app string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newOutbox creates a migrated outbox with a unique table, dropped at the
// end.
func newOutbox(t testing.TB, pool *pgxpool.Pool, opts ...Option) *Outbox {
	t.Helper()
	o, err := New(append([]Option{WithTable("outbox_" + suffix())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+o.ident) })
	return o
}

// recorder is a Publisher that remembers every published message in
// publish order, then hands it to next (if any).
type recorder struct {
	mu   sync.Mutex
	msgs []*driver.Message
	dest []string
	next func(ctx context.Context, dest string, msgs ...*driver.Message) error
}

// Close implements driver.Publisher.
func (r *recorder) Close() error { return nil }

func (r *recorder) Publish(ctx context.Context, dest string, msgs ...*driver.Message) error {
	// The lock is held through the publish so that the recorded order is
	// the order in which publishes happened.
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next != nil {
		if err := r.next(ctx, dest, msgs...); err != nil {
			return err
		}
	}
	for _, m := range msgs {
		r.msgs = append(r.msgs, m)
		r.dest = append(r.dest, dest)
	}
	return nil
}

func (r *recorder) snapshot() []*driver.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*driver.Message(nil), r.msgs...)
}

func count(t testing.TB, pool *pgxpool.Pool, q string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// txWrite returns a function that commits msgs through o in one
// transaction on pool, as a service's business transaction would.
func txWrite(pool *pgxpool.Pool, o *Outbox) func(context.Context, ...*outbox.Message) error {
	return func(ctx context.Context, msgs ...*outbox.Message) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return o.Write(ctx, tx, msgs...) })
	}
}
