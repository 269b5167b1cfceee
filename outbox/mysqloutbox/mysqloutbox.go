// Package mysqloutbox is the transactional outbox on MySQL 8 and MariaDB
// 10.6+ (database/sql with github.com/go-sql-driver/mysql): Write adds
// messages inside the caller's *sql.Tx, and the Store behind an
// outbox.Relay claims them with FOR UPDATE SKIP LOCKED. There is no
// notification: relays poll (outbox.WithPollInterval), and writers in the
// relay's process can call Relay.Wake after committing.
//
// Migrate creates two tables: the outbox (default name "outbox"; seq
// AUTO_INCREMENT primary key, id, destination, ordering_key, headers as
// JSON text, body, created_at, sent_at, attempts, available_at, parked_at,
// last_error) and "<outbox>_locks", a fixed set of
// 4096 rows that writers lock per ordering key (FOR UPDATE until commit) so
// that per key, rows commit in sequence order.
package mysqloutbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/internal/sqloutbox"
)

// DefaultTable is the outbox table's name when WithTable is not given.
const DefaultTable = "outbox"

// maxTableLength is the longest outbox table name: MySQL's 64-character
// limit less the "_locks" of the lock table's name.
const maxTableLength = 64 - len("_locks")

// LockBuckets is how many lock rows the writers' per-key locks hash onto.
// Two keys sharing a bucket only make their writers wait for each other.
const LockBuckets = 4096

// Option configures an Outbox. An invalid value makes New fail with an
// error naming the option.
type Option func(*Outbox) error

// WithTable sets the outbox table's name: ASCII letters, digits and
// underscores, at most 58 characters (the lock table adds "_locks"), not
// starting with a digit. Default "outbox".
func WithTable(name string) Option {
	return sqloutbox.WithTable("mysqloutbox", name, maxTableLength, func(o *Outbox) { o.table = name })
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

func (o *Outbox) locks() string { return o.table + "_locks" }

// Write adds msgs to the outbox inside tx, the caller's business
// transaction: they are published if and only if tx commits. A message
// without an ID gets a UUIDv7, set in the Message. The trace context of
// ctx is stored in the headers.
//
// Write locks one row of the lock table per ordering key until tx ends, so
// that per key rows commit in the order of their sequence numbers;
// concurrent writers of the same key wait for each other. The keys of one
// call are locked in a fixed order, but two transactions writing the same
// keys in opposite orders across several calls can deadlock; InnoDB then
// aborts one (error 1213), to be retried like any deadlock. Write one
// transaction's messages in one call to avoid it.
func (o *Outbox) Write(ctx context.Context, tx *sql.Tx, msgs ...*outbox.Message) error {
	ready, err := sqloutbox.Prepare(ctx, "mysqloutbox", tx == nil, msgs)
	if err != nil || len(ready) == 0 {
		return err
	}
	args := make([]any, 0, 5*len(ready))
	for _, r := range ready {
		var key any
		if r.Key != "" {
			key = r.Key
		}
		args = append(args, r.ID, r.Destination, key, r.Headers, r.Body)
	}
	if buckets := sqloutbox.LockKeys(ready, bucket); len(buckets) > 0 {
		q := fmt.Sprintf("SELECT bucket FROM %s WHERE bucket IN (%s) ORDER BY bucket FOR UPDATE", o.locks(), sqloutbox.Placeholders(len(buckets)))
		rows, err := tx.QueryContext(ctx, q, sqloutbox.Anys(buckets)...)
		if err != nil {
			return fmt.Errorf("mysqloutbox: Write: locking keys in %s: %w", o.locks(), err)
		}
		n := 0
		for rows.Next() {
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("mysqloutbox: Write: locking keys: %w", err)
		}
		if n != len(buckets) {
			return fmt.Errorf("mysqloutbox: Write: %s holds %d of %d lock rows; run Migrate", o.locks(), n, len(buckets))
		}
	}
	q := fmt.Sprintf("INSERT INTO %s (id, destination, ordering_key, headers, body) VALUES %s",
		o.table, strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?), ", len(msgs)), ", "))
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("mysqloutbox: Write into %s: %w", o.table, err)
	}
	return nil
}

func bucket(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % LockBuckets)
}

// Migrate creates the outbox and lock tables if they do not exist and
// fills the lock table. It is safe when several processes run it at once.
func (o *Outbox) Migrate(ctx context.Context, db *sql.DB) error {
	stmts := []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
	seq          BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
	id           VARBINARY(255) NOT NULL,
	destination  VARBINARY(255) NOT NULL,
	ordering_key VARBINARY(255) NULL,
	headers      LONGTEXT       NOT NULL,
	body         LONGBLOB       NOT NULL,
	created_at   TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	sent_at      TIMESTAMP(6)   NULL DEFAULT NULL,
	attempts     INT            NOT NULL DEFAULT 0,
	available_at TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	parked_at    TIMESTAMP(6)   NULL DEFAULT NULL,
	last_error   TEXT           NULL,
	KEY %[1]s_pending (sent_at, seq),
	KEY %[1]s_pending_key (ordering_key, sent_at, seq)
) ENGINE=InnoDB`, o.table),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (bucket INT NOT NULL PRIMARY KEY) ENGINE=InnoDB`, o.locks()),
	}
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("mysqloutbox: Migrate %s: %w", o.table, err)
		}
	}
	if err := o.addParkColumns(ctx, db); err != nil {
		return fmt.Errorf("mysqloutbox: Migrate %s: adding the parked_at and last_error columns: %w", o.table, err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+o.locks()).Scan(&n); err != nil {
		return fmt.Errorf("mysqloutbox: Migrate: %w", err)
	}
	if n == LockBuckets {
		return nil
	}
	vals := strings.TrimSuffix(strings.Repeat("(?), ", LockBuckets), ", ")
	args := make([]any, LockBuckets)
	for i := range args {
		args[i] = i
	}
	// A no-op update on duplicates: concurrent migrators fill the same
	// rows.
	if _, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (bucket) VALUES %s ON DUPLICATE KEY UPDATE bucket = bucket", o.locks(), vals), args...); err != nil {
		return fmt.Errorf("mysqloutbox: Migrate: filling %s: %w", o.locks(), err)
	}
	return nil
}

// addParkColumns adds parked_at and last_error to a table created before
// rows could be parked. MySQL 8 has no ADD COLUMN IF NOT EXISTS: the
// columns are looked up first, and a concurrent migrator's ALTER that wins
// the race (error 1060, duplicate column) is no failure.
func (o *Outbox) addParkColumns(ctx context.Context, db *sql.DB) error {
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.columns
WHERE table_schema = DATABASE() AND table_name = ? AND column_name IN ('parked_at', 'last_error')`, o.table).Scan(&n); err != nil {
		return err
	}
	if n == 2 {
		return nil
	}
	for _, col := range []string{"parked_at TIMESTAMP(6) NULL DEFAULT NULL", "last_error TEXT NULL"} {
		_, err := db.ExecContext(ctx, fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s", o.table, col))
		var me *mysqldrv.MySQLError
		if err != nil && !(errors.As(err, &me) && me.Number == 1060) {
			return err
		}
	}
	return nil
}

// dialect is MySQL's for the SQL shared with the other outboxes.
var dialect = sqloutbox.Dialect{
	Micros: func(col string) string { return "CAST(UNIX_TIMESTAMP(" + col + ") * 1000000 AS SIGNED)" },
	Length: "LENGTH",
	Now:    func() (string, []any) { return "CURRENT_TIMESTAMP(6)", nil },
	After: func(d time.Duration) (string, []any) {
		return "CURRENT_TIMESTAMP(6) + INTERVAL ? MICROSECOND", []any{d.Microseconds()}
	},
}

// Store returns the relay side of the outbox on db.
func (o *Outbox) Store(db *sql.DB) *Store {
	t := o.table
	cols := "seq, id, destination, COALESCE(ordering_key, ''), headers, body, " + dialect.Micros("created_at") + ", attempts"
	s := &Store{cols: cols,
		pendingSQL: fmt.Sprintf(`SELECT COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), CURRENT_TIMESTAMP(6)), 0) FROM %s WHERE sent_at IS NULL AND parked_at IS NULL`, t),
		pruneSQL:   fmt.Sprintf(`DELETE FROM %s WHERE sent_at < CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND ORDER BY sent_at LIMIT ?`, t),
	}
	for i, p := range sqloutbox.Policies {
		// A head is a row with no earlier pending (or, with HoldKey,
		// parked) row of its key, checked against the whole table (not
		// the window), so postponed rows can stay out of the window
		// without letting the row behind them pass.
		s.headsSQL[i] = fmt.Sprintf(`SELECT w.seq FROM (
	SELECT seq, ordering_key FROM %[1]s
	WHERE sent_at IS NULL AND parked_at IS NULL AND available_at <= CURRENT_TIMESTAMP(6)
	ORDER BY seq LIMIT ?
) w
WHERE w.ordering_key IS NULL OR NOT EXISTS (
	SELECT 1 FROM %[1]s p WHERE p.ordering_key = w.ordering_key AND %[2]s AND p.seq < w.seq)`, t, sqloutbox.Earlier(p))
	}
	s.Operator = sqloutbox.Operator{DB: db, Table: t, Dialect: dialect, Pending: s.Pending}
	return s
}

// NewRelay returns an outbox.Relay that publishes this outbox's rows on db
// through pub.
func (o *Outbox) NewRelay(db *sql.DB, pub driver.Publisher, opts ...outbox.Option) (*outbox.Relay, error) {
	return sqloutbox.NewRelay("mysqloutbox", "db", db, o.Store, pub, opts)
}

// Store implements outbox.Store and outbox.Operator on MySQL and MariaDB.
type Store struct {
	sqloutbox.Operator   // its DB and Table are the store's
	cols                 string
	headsSQL             [2]string // by outbox.ParkedKeyPolicy
	pendingSQL, pruneSQL string
}

var (
	_ outbox.Store    = (*Store)(nil)
	_ outbox.Operator = (*Store)(nil)
)

// Claim implements outbox.Store. The heads are found by a plain read, then
// locked by primary key with SKIP LOCKED and re-checked to be pending: a
// locking read of the window itself would skip a head held by another relay
// and take the row behind it.
func (s *Store) Claim(ctx context.Context, limit, window int, parked outbox.ParkedKeyPolicy) (outbox.Claimed, error) {
	// READ COMMITTED: each statement sees the latest commits, so rows a
	// relay marked a moment ago are not mistaken for pending.
	tx, err := s.DB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	abort := func(err error) (outbox.Claimed, error) {
		tx.Rollback()
		return nil, err
	}
	hrows, err := tx.QueryContext(ctx, s.headsSQL[parked], window)
	if err != nil {
		return abort(err)
	}
	var heads []int64
	for hrows.Next() {
		var seq int64
		if err := hrows.Scan(&seq); err != nil {
			hrows.Close()
			return abort(err)
		}
		heads = append(heads, seq)
	}
	hrows.Close()
	if err := hrows.Err(); err != nil {
		return abort(err)
	}
	if len(heads) == 0 {
		return abort(nil)
	}
	q := fmt.Sprintf("SELECT %s FROM %s WHERE seq IN (%s) AND sent_at IS NULL AND parked_at IS NULL ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED",
		s.cols, s.Table, sqloutbox.Placeholders(len(heads)))
	rows, err := tx.QueryContext(ctx, q, append(sqloutbox.Anys(heads), limit)...)
	return dialect.Claim(ctx, tx, rows, err, s.cols, s.Table, limit, parked)
}

// Pending implements outbox.Store.
func (s *Store) Pending(ctx context.Context) (int64, time.Duration, error) {
	var n, micros int64
	if err := s.DB.QueryRowContext(ctx, s.pendingSQL).Scan(&n, &micros); err != nil {
		return 0, 0, err
	}
	return n, time.Duration(micros) * time.Microsecond, nil
}

// Prune implements outbox.Store. The cut-off is computed by the database
// clock (now minus the age of before), so the session time zone does not
// matter.
func (s *Store) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	age := max(time.Since(before), 0)
	res, err := s.DB.ExecContext(ctx, s.pruneSQL, age.Microseconds(), limit)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}
