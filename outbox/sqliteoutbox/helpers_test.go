package sqliteoutbox

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/internal/outboxtest"
)

// dsn opens path as stores/sqlite.Open does: WAL, a busy_timeout, and
// transactions that take the write lock at BEGIN.
func dsn(path string) string {
	return path + "?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_txlock=immediate"
}

func tempPath(t testing.TB) string { return filepath.Join(t.TempDir(), "app.db") }

func openDB(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { db.Close() })
	return db
}

// killer is a driver.Connector over modernc's driver whose kill closes
// every connection opened so far, at its next use, as a crash of the
// process would: SQLite rolls back the connection's open transaction,
// releasing the write lock, and the caller gets driver.ErrBadConn.
type killer struct {
	drv sqldriver.Driver
	dsn string
	gen atomic.Int64
}

type innerConn interface {
	sqldriver.Conn
	sqldriver.ConnBeginTx
	sqldriver.ExecerContext
	sqldriver.QueryerContext
	sqldriver.ConnPrepareContext
}

// openKillable opens path through a killer: the relay's handle in the
// tests that kill it.
func openKillable(t testing.TB, path string) (*sql.DB, *killer) {
	t.Helper()
	probe, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	k := &killer{drv: probe.Driver(), dsn: dsn(path)}
	probe.Close()
	db := sql.OpenDB(k)
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db, k
}

func (k *killer) Connect(context.Context) (sqldriver.Conn, error) {
	gen := k.gen.Load()
	c, err := k.drv.Open(k.dsn)
	if err != nil {
		return nil, err
	}
	return &kconn{inner: c.(innerConn), k: k, gen: gen}, nil
}

func (k *killer) Driver() sqldriver.Driver { return k.drv }

func (k *killer) kill() { k.gen.Add(1) }

// kconn is one connection of a killer. database/sql uses a connection from
// one goroutine at a time, so closed needs no lock.
type kconn struct {
	inner  innerConn
	k      *killer
	gen    int64
	closed bool
}

func (c *kconn) dead() error {
	if c.gen == c.k.gen.Load() && !c.closed {
		return nil
	}
	if !c.closed {
		c.closed = true
		c.inner.Close()
	}
	return sqldriver.ErrBadConn
}

func (c *kconn) Prepare(q string) (sqldriver.Stmt, error) {
	return c.PrepareContext(context.Background(), q)
}

func (c *kconn) PrepareContext(ctx context.Context, q string) (sqldriver.Stmt, error) {
	if err := c.dead(); err != nil {
		return nil, err
	}
	return c.inner.PrepareContext(ctx, q)
}

func (c *kconn) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	return c.inner.Close()
}

func (c *kconn) Begin() (sqldriver.Tx, error) {
	return c.BeginTx(context.Background(), sqldriver.TxOptions{})
}

func (c *kconn) BeginTx(ctx context.Context, opts sqldriver.TxOptions) (sqldriver.Tx, error) {
	if err := c.dead(); err != nil {
		return nil, err
	}
	tx, err := c.inner.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &ktx{inner: tx, c: c}, nil
}

func (c *kconn) ExecContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	if err := c.dead(); err != nil {
		return nil, err
	}
	return c.inner.ExecContext(ctx, q, args)
}

func (c *kconn) QueryContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	if err := c.dead(); err != nil {
		return nil, err
	}
	return c.inner.QueryContext(ctx, q, args)
}

func (c *kconn) IsValid() bool { return c.dead() == nil }

func (c *kconn) ResetSession(context.Context) error { return c.dead() }

type ktx struct {
	inner sqldriver.Tx
	c     *kconn
}

func (t *ktx) Commit() error {
	if err := t.c.dead(); err != nil {
		return err
	}
	return t.inner.Commit()
}

func (t *ktx) Rollback() error {
	if err := t.c.dead(); err != nil {
		return err
	}
	return t.inner.Rollback()
}

func newOutbox(t testing.TB, db *sql.DB) *Outbox {
	t.Helper()
	o, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return o
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// recorder remembers published messages in publish order, then calls next.
type recorder struct {
	mu   sync.Mutex
	msgs []*driver.Message
	next func(ctx context.Context, dest string, msgs ...*driver.Message) error
}

// Close implements driver.Publisher.
func (r *recorder) Close() error { return nil }

func (r *recorder) Publish(ctx context.Context, dest string, msgs ...*driver.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next != nil {
		if err := r.next(ctx, dest, msgs...); err != nil {
			return err
		}
	}
	r.msgs = append(r.msgs, msgs...)
	return nil
}

func (r *recorder) snapshot() []*driver.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*driver.Message(nil), r.msgs...)
}

func count(t testing.TB, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkOrder fails unless msgs hold keys*perKey distinct messages whose
// bodies count 1, 2, … per key in publish order (copies skipped).
func checkOrder(t testing.TB, msgs []*driver.Message, keys, perKey int) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	dups := 0
	for _, m := range msgs {
		if seen[m.ID] {
			dups++
			continue
		}
		seen[m.ID] = true
		n, _ := strconv.Atoi(string(m.Body))
		if n != last[m.Key]+1 {
			t.Fatalf("key %s: message %d published after %d", m.Key, n, last[m.Key])
		}
		last[m.Key] = n
	}
	if len(seen) != keys*perKey {
		t.Fatalf("%d distinct messages published, want %d", len(seen), keys*perKey)
	}
	t.Logf("%d messages in order per key, %d republished copies", len(seen), dups)
}

func waitPending(t testing.TB, s outbox.Store) {
	t.Helper()
	outboxtest.WaitDrained(t, s, 60*time.Second)
}
