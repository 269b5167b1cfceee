// Package sqliteoutbox is the transactional outbox on SQLite
// (database/sql with modernc.org/sqlite, pure Go, the driver stores/sqlite
// uses): Write adds messages inside the caller's *sql.Tx, and the Store
// behind an outbox.Relay claims them inside a transaction that holds
// SQLite's write lock. There is no notification: relays poll
// (outbox.WithPollInterval), and writers in the relay's process can call
// Relay.Wake after committing.
//
// SQLite lets one transaction write at a time, which makes both halves
// simple. Writers need no per-key locks: a row's seq (INTEGER PRIMARY KEY
// AUTOINCREMENT) is assigned when it is inserted, inside a write
// transaction that no other writer runs beside, so rows commit in seq
// order. A claim's first statement is a write, so its transaction holds
// the write lock from the start, whatever the handle's _txlock, until
// Finish or Abort: two relays on the same file claim one after the other,
// and the second sees the first one's marks. The same lock makes the
// business transactions that write to the file wait while a relay
// publishes a batch, so open the handles with a busy_timeout longer than a
// batch's publish (and, as stores/sqlite does, with _txlock=immediate and
// journal_mode(WAL)), and keep batches small when publishing is slow. A
// relay that keeps finding full batches claims back to back; others get
// the lock between its claims when their busy handler's retries find it
// free, so a second relay on the file is a standby (it takes over when the
// first stops or backs off after a failure) more than a second worker. If
// the relay's process dies, SQLite rolls its claim back: the rows stay
// pending and are published again (the consumers' dedup absorbs the
// copies).
//
// The package does not import the driver: import modernc.org/sqlite (or
// stores/sqlite, which does) to register "sqlite".
//
// Migrate creates the outbox table (default name "outbox"):
//
//	CREATE TABLE outbox (
//	    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
//	    id           TEXT    NOT NULL,
//	    destination  TEXT    NOT NULL,
//	    ordering_key TEXT    NULL,
//	    headers      TEXT    NOT NULL, -- JSON object
//	    body         BLOB    NOT NULL,
//	    created_at   INTEGER NOT NULL, -- Unix microseconds
//	    sent_at      INTEGER NULL,     -- Unix microseconds; NULL while pending
//	    attempts     INTEGER NOT NULL DEFAULT 0,
//	    available_at INTEGER NOT NULL, -- Unix microseconds
//	    parked_at    INTEGER NULL,     -- Unix microseconds; set while parked
//	    last_error   TEXT    NULL      -- the last failed publish's error
//	);
//
// with partial indexes on the pending rows (by seq, and by ordering key
// and seq) and on the sent rows' sent_at. Times come from the clock of the
// process that writes them, which for an embedded database is the
// database's clock.
package sqliteoutbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/internal/sqlident"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/internal/sqloutbox"
)

// DefaultTable is the outbox table's name when WithTable is not given.
const DefaultTable = "outbox"

// writeChunk bounds the rows of one INSERT: 7 parameters a row stays under
// SQLITE_MAX_VARIABLE_NUMBER even on builds that keep the historic 999.
const writeChunk = 100

// Option configures an Outbox. An invalid value makes New fail with an
// error naming the option.
type Option func(*Outbox) error

// WithTable sets the outbox table's name: ASCII letters, digits and
// underscores, not starting with a digit, at most sqlident's portable
// length. Default "outbox".
func WithTable(name string) Option {
	return sqloutbox.WithTable("sqliteoutbox", name, sqlident.MaxLength, func(o *Outbox) { o.table = name })
}

// Outbox is one outbox table: how to write to it and how relays read it.
type Outbox struct {
	table string
}

// New returns an Outbox for the configured table.
func New(opts ...Option) (*Outbox, error) {
	o := &Outbox{table: DefaultTable}
	if err := option.Apply(o, opts...); err != nil {
		return nil, err
	}
	return o, nil
}

var defaultOutbox = &Outbox{table: DefaultTable}

// Write adds msgs to the default outbox table ("outbox") inside tx; see
// Outbox.Write.
func Write(ctx context.Context, tx *sql.Tx, msgs ...*outbox.Message) error {
	return defaultOutbox.Write(ctx, tx, msgs...)
}

// Table returns the outbox table's name.
func (o *Outbox) Table() string { return o.table }

// Write adds msgs to the outbox inside tx, the caller's business
// transaction: they are published if and only if tx commits. A message
// without an ID gets a UUIDv7, set in the Message. The trace context of
// ctx is stored in the headers.
//
// Write takes no lock of its own: SQLite runs one write transaction at a
// time, so per key rows commit in the order of their sequence numbers.
// Like any write, it waits busy_timeout for the write lock when another
// transaction (a relay's claim among them) holds it.
func (o *Outbox) Write(ctx context.Context, tx *sql.Tx, msgs ...*outbox.Message) error {
	ready, err := sqloutbox.Prepare(ctx, "sqliteoutbox", tx == nil, msgs)
	if err != nil || len(ready) == 0 {
		return err
	}
	now := time.Now().UnixMicro()
	for len(ready) > 0 {
		chunk := ready[:min(len(ready), writeChunk)]
		ready = ready[len(chunk):]
		args := make([]any, 0, 7*len(chunk))
		for _, r := range chunk {
			var key any
			if r.Key != "" {
				key = r.Key
			}
			args = append(args, r.ID, r.Destination, key, r.Headers, r.Body, now, now)
		}
		q := fmt.Sprintf("INSERT INTO %s (id, destination, ordering_key, headers, body, created_at, available_at) VALUES %s",
			o.table, strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?), ", len(chunk)), ", "))
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("sqliteoutbox: Write into %s: %w", o.table, err)
		}
	}
	return nil
}

// Migrate creates the outbox table and its indexes if they do not exist.
// It is safe when several processes run it at once.
func (o *Outbox) Migrate(ctx context.Context, db *sql.DB) error {
	t := o.table
	stmts := []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	seq          INTEGER PRIMARY KEY AUTOINCREMENT,
	id           TEXT    NOT NULL,
	destination  TEXT    NOT NULL,
	ordering_key TEXT    NULL,
	headers      TEXT    NOT NULL,
	body         BLOB    NOT NULL,
	created_at   INTEGER NOT NULL,
	sent_at      INTEGER NULL,
	attempts     INTEGER NOT NULL DEFAULT 0,
	available_at INTEGER NOT NULL,
	parked_at    INTEGER NULL,
	last_error   TEXT    NULL
)`, t),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %[1]s_pending ON %[1]s (seq) WHERE sent_at IS NULL`, t),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %[1]s_pending_key ON %[1]s (ordering_key, seq) WHERE sent_at IS NULL`, t),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %[1]s_sent ON %[1]s (sent_at) WHERE sent_at IS NOT NULL`, t),
	}
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("sqliteoutbox: Migrate %s: %w", t, err)
		}
	}
	if err := o.addParkColumns(ctx, db); err != nil {
		return fmt.Errorf("sqliteoutbox: Migrate %s: adding the parked_at and last_error columns: %w", t, err)
	}
	return nil
}

// addParkColumns adds parked_at and last_error to a table created before
// rows could be parked. SQLite has no ADD COLUMN IF NOT EXISTS: the
// columns are looked up first, and a concurrent migrator's ALTER that wins
// the race ("duplicate column name") is no failure.
func (o *Outbox) addParkColumns(ctx context.Context, db *sql.DB) error {
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM pragma_table_info(?) WHERE name IN ('parked_at', 'last_error')`, o.table).Scan(&n); err != nil {
		return err
	}
	if n == 2 {
		return nil
	}
	for _, col := range []string{"parked_at INTEGER NULL", "last_error TEXT NULL"} {
		_, err := db.ExecContext(ctx, fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s", o.table, col))
		if err != nil && !strings.Contains(err.Error(), "duplicate column name") {
			return err
		}
	}
	return nil
}

// dialect is SQLite's for the SQL shared with the other outboxes: times
// are Unix microseconds from this process's clock.
var dialect = sqloutbox.Dialect{
	Micros: func(col string) string { return col },
	Length: "LENGTH",
	Now:    func() (string, []any) { return "?", []any{time.Now().UnixMicro()} },
	After: func(d time.Duration) (string, []any) {
		return "?", []any{time.Now().Add(d).UnixMicro()}
	},
}

// Store returns the relay side of the outbox on db.
func (o *Outbox) Store(db *sql.DB) *Store {
	t := o.table
	cols := "seq, id, destination, COALESCE(ordering_key, ''), headers, body, created_at, attempts"
	s := &Store{cols: cols,
		// A write that changes nothing still takes the write lock: the
		// claim holds it from here to Finish or Abort.
		lockSQL:    fmt.Sprintf(`UPDATE %s SET attempts = attempts WHERE seq = -1`, t),
		pendingSQL: fmt.Sprintf(`SELECT COUNT(*), COALESCE(MIN(created_at), 0) FROM %s WHERE sent_at IS NULL AND parked_at IS NULL`, t),
		pruneSQL: fmt.Sprintf(`DELETE FROM %[1]s WHERE seq IN (
	SELECT seq FROM %[1]s WHERE sent_at IS NOT NULL AND sent_at < ? ORDER BY sent_at LIMIT ?)`, t),
	}
	for i, p := range sqloutbox.Policies {
		// A head is a row with no earlier pending (or, with HoldKey,
		// parked) row of its key, checked against the whole table (not
		// the window), so postponed rows can stay out of the window
		// without letting the row behind them pass.
		s.headsSQL[i] = fmt.Sprintf(`SELECT %[2]s FROM %[1]s
WHERE seq IN (
	SELECT seq FROM %[1]s WHERE sent_at IS NULL AND parked_at IS NULL AND available_at <= ?1
	ORDER BY seq LIMIT ?2
) AND (ordering_key IS NULL OR NOT EXISTS (
	SELECT 1 FROM %[1]s p WHERE p.ordering_key = %[1]s.ordering_key AND %[3]s AND p.seq < %[1]s.seq))
ORDER BY seq LIMIT ?3`, t, cols, sqloutbox.Earlier(p))
	}
	s.Operator = sqloutbox.Operator{DB: db, Table: t, Dialect: dialect, Pending: s.Pending}
	return s
}

// NewRelay returns an outbox.Relay that publishes this outbox's rows on db
// through pub.
func (o *Outbox) NewRelay(db *sql.DB, pub driver.Publisher, opts ...outbox.Option) (*outbox.Relay, error) {
	return sqloutbox.NewRelay("sqliteoutbox", "db", db, o.Store, pub, opts)
}

// Store implements outbox.Store and outbox.Operator on SQLite.
type Store struct {
	sqloutbox.Operator            // its DB and Table are the store's
	cols                          string
	headsSQL                      [2]string // by outbox.ParkedKeyPolicy
	lockSQL, pendingSQL, pruneSQL string
}

var (
	_ outbox.Store    = (*Store)(nil)
	_ outbox.Operator = (*Store)(nil)
)

// Claim implements outbox.Store. Its transaction writes first, so it waits
// (busy_timeout) for SQLite's write lock and then holds it until Finish or
// Abort: no other relay claims meanwhile, and the heads it finds, the rows
// with no earlier pending row of their key, are all its own.
func (s *Store) Claim(ctx context.Context, limit, window int, parked outbox.ParkedKeyPolicy) (outbox.Claimed, error) {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	abort := func(err error) (outbox.Claimed, error) {
		tx.Rollback()
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, s.lockSQL); err != nil {
		return abort(fmt.Errorf("taking the write lock: %w", err))
	}
	rows, err := tx.QueryContext(ctx, s.headsSQL[parked], time.Now().UnixMicro(), window, limit)
	return dialect.Claim(ctx, tx, rows, err, s.cols, s.Table, limit, parked)
}

// Pending implements outbox.Store. SQLite is embedded: the database clock
// is this process's clock.
func (s *Store) Pending(ctx context.Context) (int64, time.Duration, error) {
	var n, oldest int64
	if err := s.DB.QueryRowContext(ctx, s.pendingSQL).Scan(&n, &oldest); err != nil {
		return 0, 0, err
	}
	if n == 0 {
		return 0, 0, nil
	}
	return n, max(time.Since(time.UnixMicro(oldest)), 0), nil
}

// Prune implements outbox.Store: it deletes the oldest sent rows whose
// sent_at is before the given time.
func (s *Store) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	res, err := s.DB.ExecContext(ctx, s.pruneSQL, before.UnixMicro(), limit)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}
