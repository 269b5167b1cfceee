// Package pgoutbox is the transactional outbox on PostgreSQL (pgx/v5):
// Write adds messages inside the caller's pgx.Tx, and the Store behind an
// outbox.Relay claims them with FOR UPDATE SKIP LOCKED and wakes relays
// with LISTEN/NOTIFY.
//
// The table (default name "outbox"; create it with Migrate):
//
//	seq          BIGINT IDENTITY PRIMARY KEY  -- per key, the commit order
//	id           TEXT        NOT NULL         -- the message's business id
//	destination  TEXT        NOT NULL
//	ordering_key TEXT                         -- NULL: no ordering
//	headers      JSONB       NOT NULL
//	body         BYTEA       NOT NULL
//	created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
//	sent_at      TIMESTAMPTZ                  -- NULL: pending
//	attempts     INT         NOT NULL         -- failed publishes so far
//	available_at TIMESTAMPTZ NOT NULL         -- postponed after a failure until
//	parked_at    TIMESTAMPTZ                  -- set while parked
//	last_error   TEXT                         -- the last failed publish's error
package pgoutbox

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/internal/sqlident"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/internal/sqloutbox"
)

// DefaultTable is the outbox table's name when WithTable is not given.
const DefaultTable = "outbox"

type config struct {
	table  string
	notify bool
}

// Option configures an Outbox. An invalid value makes New fail with an
// error naming the option.
type Option func(*config) error

// WithTable sets the outbox table's name: ASCII letters, digits and
// underscores, at most 63 characters. Default "outbox". The NOTIFY channel
// has the same name.
func WithTable(name string) Option {
	return sqloutbox.WithTable("pgoutbox", name, sqlident.MaxLength, func(c *config) { c.table = name })
}

// WithNotify sets whether Write sends a NOTIFY on the table's channel, which
// Postgres delivers at commit, so an idle relay publishes at once instead
// of at its next poll. NOTIFY takes a database-wide lock at commit; turn it
// off when very many small transactions write and a poll interval of
// latency is acceptable. Default true.
func WithNotify(on bool) Option {
	return func(c *config) error { c.notify = on; return nil }
}

// Outbox is one outbox table: how to write to it and how relays read it.
type Outbox struct {
	table   string // validated, unquoted
	ident   string // quoted for SQL text
	notify  bool
	lockKey int32 // first half of the writers' advisory lock, from the table name

	insertSQL, lockSQL string
}

// New returns an Outbox for the configured table.
func New(opts ...Option) (*Outbox, error) {
	c := config{table: DefaultTable, notify: true}
	if err := option.Apply(&c, opts...); err != nil {
		return nil, err
	}
	h := fnv.New32a()
	h.Write([]byte("idemq.outbox." + c.table))
	o := &Outbox{table: c.table, ident: pgx.Identifier{c.table}.Sanitize(), notify: c.notify, lockKey: int32(h.Sum32())}
	o.insertSQL = fmt.Sprintf(`INSERT INTO %s (id, destination, ordering_key, headers, body)
SELECT m.id, m.destination, NULLIF(m.okey, ''), m.headers::jsonb, m.body
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[]) WITH ORDINALITY AS m(id, destination, okey, headers, body, ord)
ORDER BY m.ord`, o.ident)
	// The hashes come sorted, and the aggregate takes the locks in array
	// order, so two writers of the same keys cannot deadlock on them.
	o.lockSQL = `SELECT count(pg_advisory_xact_lock($1::int4, h)) FROM unnest($2::int4[]) AS t(h)`
	return o, nil
}

var defaultOutbox = func() *Outbox {
	o, err := New()
	if err != nil {
		panic(err)
	}
	return o
}()

// Write adds msgs to the default outbox table ("outbox") inside tx; see
// Outbox.Write.
func Write(ctx context.Context, tx pgx.Tx, msgs ...*outbox.Message) error {
	return defaultOutbox.Write(ctx, tx, msgs...)
}

// Table returns the outbox table's name.
func (o *Outbox) Table() string { return o.table }

// Write adds msgs to the outbox inside tx, the caller's business
// transaction: they are published if and only if tx commits. A message
// without an ID gets a UUIDv7, set in the Message. The trace context of
// ctx is stored in the headers.
//
// Write holds a transaction-scoped advisory lock per ordering key until tx
// ends, so that per key rows commit in the order of their sequence numbers;
// concurrent writers of the same key wait for each other. Keys of one call
// are locked in a fixed order, but two transactions writing the same keys
// in opposite orders across several calls can deadlock; Postgres then
// aborts one (SQLSTATE 40P01), to be retried like any deadlock. Write one
// transaction's messages in one call to avoid it.
func (o *Outbox) Write(ctx context.Context, tx pgx.Tx, msgs ...*outbox.Message) error {
	ready, err := sqloutbox.Prepare(ctx, "pgoutbox", tx == nil, msgs)
	if err != nil || len(ready) == 0 {
		return err
	}
	n := len(ready)
	ids, dests, keys, headers := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	bodies := make([][]byte, n)
	for i, r := range ready {
		ids[i], dests[i], keys[i], headers[i], bodies[i] = r.ID, r.Destination, r.Key, r.Headers, r.Body
	}
	locks := sqloutbox.LockKeys(ready, keyHash)

	b := &pgx.Batch{}
	if len(locks) > 0 {
		b.Queue(o.lockSQL, o.lockKey, locks)
	}
	b.Queue(o.insertSQL, ids, dests, keys, headers, bodies)
	if o.notify {
		b.Queue(`SELECT pg_notify($1, '')`, o.table)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("pgoutbox: Write into %s: %w", o.table, err)
	}
	return nil
}

// keyHash maps an ordering key to the second half of its advisory lock.
// Two keys sharing a hash only make their writers wait for each other.
func keyHash(key string) int32 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int32(h.Sum32())
}

// Migrate creates the outbox table and its indexes if they do not exist. It
// is safe when several processes run it at once.
func (o *Outbox) Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	t := o.ident
	idx := func(what string) string { return pgx.Identifier{o.table + "_" + what}.Sanitize() }
	stmts := []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id           TEXT        NOT NULL,
	destination  TEXT        NOT NULL,
	ordering_key TEXT,
	headers      JSONB       NOT NULL DEFAULT '{}',
	body         BYTEA       NOT NULL,
	created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
	sent_at      TIMESTAMPTZ,
	attempts     INT         NOT NULL DEFAULT 0,
	available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	parked_at    TIMESTAMPTZ,
	last_error   TEXT
)`, t),
		// Tables created before rows could be parked.
		fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS parked_at TIMESTAMPTZ, ADD COLUMN IF NOT EXISTS last_error TEXT`, t),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (seq) WHERE sent_at IS NULL AND parked_at IS NOT NULL`, idx("parked"), t),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (seq) WHERE sent_at IS NULL`, idx("pending"), t),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (ordering_key, seq) WHERE sent_at IS NULL AND ordering_key IS NOT NULL`, idx("pending_key"), t),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (sent_at) WHERE sent_at IS NOT NULL`, idx("sent"), t),
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgoutbox: Migrate: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// Concurrent CREATE TABLE IF NOT EXISTS can still collide in the
	// catalog; the lock makes migrators take turns.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, 0)`, o.lockKey); err != nil {
		return fmt.Errorf("pgoutbox: Migrate: %w", err)
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("pgoutbox: Migrate %s: %w", o.table, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgoutbox: Migrate: %w", err)
	}
	return nil
}

// Store returns the relay side of the outbox on pool.
func (o *Outbox) Store(pool *pgxpool.Pool) *Store {
	t := o.ident
	cols := `seq, id, destination, coalesce(ordering_key, ''), headers, body, created_at, attempts`
	s := &Store{o: o, pool: pool,
		markSQL:   fmt.Sprintf(`UPDATE %s SET sent_at = now() WHERE seq = ANY($1::bigint[])`, t),
		deleteSQL: fmt.Sprintf(`DELETE FROM %s WHERE seq = ANY($1::bigint[])`, t),
		postponeSQL: fmt.Sprintf(`UPDATE %s SET attempts = attempts + 1, last_error = $3, available_at = now() + $2::bigint * interval '1 microsecond'
WHERE seq = ANY($1::bigint[])`, t),
		parkSQL:    fmt.Sprintf(`UPDATE %s SET attempts = attempts + 1, last_error = $2, parked_at = now() WHERE seq = ANY($1::bigint[])`, t),
		pendingSQL: fmt.Sprintf(`SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM %s WHERE sent_at IS NULL AND parked_at IS NULL`, t),
		pruneSQL:   fmt.Sprintf(`DELETE FROM %[1]s WHERE seq IN (SELECT seq FROM %[1]s WHERE sent_at < $1 ORDER BY sent_at LIMIT $2)`, t),
	}
	for i, p := range sqloutbox.Policies {
		// A head is a row with no earlier pending (or, with HoldKey,
		// parked) row of its key, checked against the whole table (not
		// the window), so postponed rows can stay out of the window
		// without letting the row behind them pass.
		s.claimSQL[i] = fmt.Sprintf(`WITH win AS (
	SELECT seq, ordering_key FROM %[1]s
	WHERE sent_at IS NULL AND parked_at IS NULL AND available_at <= now()
	ORDER BY seq LIMIT $1
)
SELECT %[2]s FROM %[1]s
WHERE seq IN (
	SELECT w.seq FROM win w
	WHERE w.ordering_key IS NULL OR NOT EXISTS (
		SELECT 1 FROM %[1]s p
		WHERE p.ordering_key = w.ordering_key AND %[3]s AND p.seq < w.seq))
AND sent_at IS NULL AND parked_at IS NULL
ORDER BY seq LIMIT $2
FOR UPDATE SKIP LOCKED`, t, cols, sqloutbox.Earlier(p))
		s.runSQL[i] = fmt.Sprintf(`SELECT %[2]s FROM %[1]s
WHERE ordering_key = ANY($1::text[]) AND sent_at IS NULL AND parked_at IS NULL AND seq <> ALL($2::bigint[]) AND %[3]s
ORDER BY seq LIMIT $3`, t, cols, sqloutbox.NotBehindParked(p, t))
	}
	return s
}

// dialect is Postgres's for the SQL shared with the other outboxes.
var dialect = sqloutbox.Dialect{
	Postgres: true,
	Micros:   func(col string) string { return "(extract(epoch FROM " + col + ") * 1000000)::bigint" },
	Length:   "octet_length",
	Now:      func() (string, []any) { return "now()", nil },
}

// NewRelay returns an outbox.Relay that publishes this outbox's rows on
// pool through pub.
func (o *Outbox) NewRelay(pool *pgxpool.Pool, pub driver.Publisher, opts ...outbox.Option) (*outbox.Relay, error) {
	return sqloutbox.NewRelay("pgoutbox", "pool", pool, o.Store, pub, opts)
}

// Store implements outbox.Store, outbox.Notifier and outbox.Operator on
// Postgres.
type Store struct {
	o    *Outbox
	pool *pgxpool.Pool

	claimSQL, runSQL                                               [2]string // by outbox.ParkedKeyPolicy
	markSQL, deleteSQL, postponeSQL, parkSQL, pendingSQL, pruneSQL string
}

var (
	_ outbox.Store    = (*Store)(nil)
	_ outbox.Notifier = (*Store)(nil)
	_ outbox.Operator = (*Store)(nil)
)

func scanRows(rows pgx.Rows) ([]*outbox.Row, error) {
	var out []*outbox.Row
	for rows.Next() {
		r := &outbox.Row{}
		if err := rows.Scan(&r.Seq, &r.ID, &r.Destination, &r.Key, &r.Headers, &r.Body, &r.CreatedAt, &r.Attempts); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Claim implements outbox.Store.
func (s *Store) Claim(ctx context.Context, limit, window int, parked outbox.ParkedKeyPolicy) (outbox.Claimed, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	c := &claimed{s: s, tx: tx}
	q, err := tx.Query(ctx, s.claimSQL[parked], window, limit)
	if err == nil {
		c.rows, err = scanRows(q)
	}
	if err != nil || len(c.rows) == 0 {
		tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	c.rows, err = sqloutbox.AppendRuns(c.rows, limit, func(keys []string, seqs []int64, room int) ([]*outbox.Row, error) {
		q, err := tx.Query(ctx, s.runSQL[parked], keys, seqs, room)
		if err != nil {
			return nil, err
		}
		return scanRows(q)
	})
	if err != nil {
		tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return c, nil
}

type claimed struct {
	s    *Store
	tx   pgx.Tx
	rows []*outbox.Row
}

func (c *claimed) Rows() []*outbox.Row { return c.rows }

func (c *claimed) Finish(ctx context.Context, o outbox.Outcome) error {
	b := &pgx.Batch{}
	if len(o.Sent) > 0 {
		q := c.s.markSQL
		if o.Delete {
			q = c.s.deleteSQL
		}
		b.Queue(q, o.Sent)
	}
	for _, f := range o.Failed {
		if f.Park {
			b.Queue(c.s.parkSQL, f.Seqs, f.Cause)
		} else {
			b.Queue(c.s.postponeSQL, f.Seqs, f.RetryAfter.Microseconds(), f.Cause)
		}
	}
	if err := c.tx.SendBatch(ctx, b).Close(); err != nil {
		c.tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return c.tx.Commit(ctx)
}

func (c *claimed) Abort(ctx context.Context) error { return c.tx.Rollback(ctx) }

// Pending implements outbox.Store.
func (s *Store) Pending(ctx context.Context) (int64, time.Duration, error) {
	var n int64
	var age float64
	if err := s.pool.QueryRow(ctx, s.pendingSQL).Scan(&n, &age); err != nil {
		return 0, 0, err
	}
	return n, time.Duration(age * float64(time.Second)), nil
}

// Prune implements outbox.Store.
func (s *Store) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	tag, err := s.pool.Exec(ctx, s.pruneSQL, before, limit)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// Listen implements outbox.Notifier: it holds one connection of the pool
// listening on the table's channel.
func (s *Store) Listen(ctx context.Context, wake func()) error {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection's LISTEN state must not go back to the pool.
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+s.o.ident); err != nil {
		return err
	}
	wake() // rows written while nobody listened
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		wake()
	}
}

// Parked implements outbox.Operator.
func (s *Store) Parked(ctx context.Context, f outbox.ParkedFilter) ([]outbox.ParkedRow, error) {
	q, args := dialect.ParkedSQL(s.o.ident, f)
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return sqloutbox.ScanParked(rows)
}

// Redrive implements outbox.Operator.
func (s *Store) Redrive(ctx context.Context, f outbox.ParkedFilter) (int64, error) {
	q, args := dialect.RedriveSQL(s.o.ident, f)
	return s.exec(ctx, q, args)
}

// Purge implements outbox.Operator.
func (s *Store) Purge(ctx context.Context, f outbox.ParkedFilter) (int64, error) {
	q, args := dialect.PurgeSQL(s.o.ident, f)
	return s.exec(ctx, q, args)
}

func (s *Store) exec(ctx context.Context, q string, args []any) (int64, error) {
	tag, err := s.pool.Exec(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// Stats implements outbox.Operator.
func (s *Store) Stats(ctx context.Context) (outbox.TableStats, error) {
	var st outbox.TableStats
	var err error
	if st.Pending, st.OldestPending, err = s.Pending(ctx); err != nil {
		return st, err
	}
	err = s.pool.QueryRow(ctx, sqloutbox.StatsSQL(s.o.ident)).Scan(&st.Parked, &st.HeldKeys, &st.HeldRows)
	return st, err
}
