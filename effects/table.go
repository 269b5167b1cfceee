package effects

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/internal/sqlident"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Dialect is the SQL dialect of an effects table.
type Dialect int

const (
	// Postgres takes pgx handles: pgx.Tx, *pgxpool.Pool, *pgx.Conn.
	Postgres Dialect = iota + 1
	// MySQL (and MariaDB) takes database/sql handles: *sql.Tx, *sql.DB,
	// *sql.Conn.
	MySQL
)

// DefaultTable is the effects table's name when WithTable is not given.
const DefaultTable = "idemq_effects"

// Option configures a Table. An invalid value makes NewTable fail with an
// error naming the option.
type Option func(*Table) error

// WithTable sets the table's name: ASCII letters, digits and underscores,
// at most 63 characters, not starting with a digit. Default
// "idemq_effects".
func WithTable(name string) Option {
	return func(t *Table) error {
		if err := sqlident.Check(name); err != nil {
			return fmt.Errorf("effects: WithTable: %w", err)
		}
		t.name = name
		return nil
	}
}

// WithKeyer makes Remember give each call a context carrying the call's
// idempotency key (consumer, message id, purpose), so a client using
// Transport sends it. Default: no key is added.
func WithKeyer(k *Keyer) Option {
	return func(t *Table) error {
		if k == nil {
			return errors.New("effects: WithKeyer: nil keyer")
		}
		t.keyer = k
		return nil
	}
}

// Table is an effects table: the recorded results of external calls, one
// per (consumer, message id, purpose).
type Table struct {
	dialect Dialect
	name    string
	keyer   *Keyer
}

// NewTable returns the effects table of the given dialect.
func NewTable(d Dialect, opts ...Option) (*Table, error) {
	if d != Postgres && d != MySQL {
		return nil, fmt.Errorf("effects: NewTable: unknown dialect %d (use effects.Postgres or effects.MySQL)", d)
	}
	t := &Table{dialect: d, name: DefaultTable}
	if err := option.Apply(t, opts...); err != nil {
		return nil, err
	}
	return t, nil
}

// Name returns the table's name.
func (t *Table) Name() string { return t.name }

// Migrate creates the table if it does not exist. db is a handle of the
// table's dialect (see Dialect).
func (t *Table) Migrate(ctx context.Context, db any) error {
	var stmt string
	if t.dialect == Postgres {
		stmt = `CREATE TABLE IF NOT EXISTS ` + t.name + ` (
	consumer    TEXT        NOT NULL,
	message_id  TEXT        NOT NULL,
	purpose     TEXT        NOT NULL,
	result      BYTEA       NOT NULL,
	recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_id, purpose)
)`
	} else {
		// VARBINARY keeps the key within InnoDB's 3072-byte limit and
		// compares bytes, as ids are compared everywhere else.
		stmt = `CREATE TABLE IF NOT EXISTS ` + t.name + ` (
	consumer    VARBINARY(255) NOT NULL,
	message_id  VARBINARY(255) NOT NULL,
	purpose     VARBINARY(255) NOT NULL,
	result      LONGBLOB       NOT NULL,
	recorded_at TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	PRIMARY KEY (consumer, message_id, purpose),
	KEY ` + t.name + `_recorded (recorded_at)
) ENGINE=InnoDB`
	}
	q, err := t.querier(db)
	if err != nil {
		return err
	}
	if _, err := q.exec(ctx, stmt); err != nil {
		return fmt.Errorf("effects: Migrate %s: %w", t.name, err)
	}
	return nil
}

// Remember returns the result recorded for (consumer, messageID, purpose),
// or, when there is none, calls call, records its result and returns it.
// A failed call records nothing and its error is returned as is, so the
// message is retried. With WithKeyer, call's context carries the
// idempotency key of the triple.
//
// Where the record lives depends on db:
//
//   - The connection pool (*pgxpool.Pool, *sql.DB): the result commits at
//     once, on its own, so it survives the handler's transaction rolling
//     back — the case in which idemq runs the handler again. This is the
//     usual choice.
//   - The handler's transaction (pgx.Tx, *sql.Tx): the result commits with
//     the business effect or not at all. A rolled-back run leaves no
//     record, and the next run calls out again, so send an idempotency key
//     too.
//
// Between the call and the record a crash can still lose the result; the
// idempotency key is what makes the provider answer the repeated call
// without acting twice. Two runs racing on the same triple both call (with
// the same key); the first recorded result wins and both return it.
func (t *Table) Remember(ctx context.Context, db any, consumer, messageID, purpose string, call func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	if call == nil {
		return nil, errors.New("effects: Remember: nil call")
	}
	q, err := t.querier(db)
	if err != nil {
		return nil, err
	}
	res, found, err := t.lookup(ctx, q, consumer, messageID, purpose)
	if err != nil || found {
		return res, err
	}
	cctx := ctx
	if t.keyer != nil {
		cctx = WithIdempotencyKey(ctx, t.keyer.Key(consumer, messageID, purpose))
	}
	res, err = call(cctx)
	if err != nil {
		return nil, err
	}
	if res == nil {
		res = []byte{}
	}
	var ins string
	if t.dialect == Postgres {
		ins = `INSERT INTO ` + t.name + ` (consumer, message_id, purpose, result) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`
	} else {
		// A no-op update instead of INSERT IGNORE, which would also hide
		// errors other than the duplicate key.
		ins = `INSERT INTO ` + t.name + ` (consumer, message_id, purpose, result) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE consumer = consumer`
	}
	if _, err := q.exec(ctx, ins, consumer, messageID, purpose, res); err != nil {
		return nil, fmt.Errorf("effects: recording the result of %s for %s: %w", purpose, messageID, err)
	}
	// Another run may have recorded first: everyone returns the first.
	stored, found, err := t.lookup(ctx, q, consumer, messageID, purpose)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("effects: result of %s for %s not found after recording it", purpose, messageID)
	}
	return stored, nil
}

func (t *Table) lookup(ctx context.Context, q querier, consumer, messageID, purpose string) ([]byte, bool, error) {
	var sel string
	if t.dialect == Postgres {
		sel = `SELECT result FROM ` + t.name + ` WHERE consumer = $1 AND message_id = $2 AND purpose = $3`
	} else {
		sel = `SELECT result FROM ` + t.name + ` WHERE consumer = ? AND message_id = ? AND purpose = ?`
	}
	res, found, err := q.queryBytes(ctx, sel, consumer, messageID, purpose)
	if err != nil {
		return nil, false, fmt.Errorf("effects: looking up %s for %s: %w", purpose, messageID, err)
	}
	return res, found, nil
}

// Prune deletes at most limit results recorded before the given time and
// returns how many it deleted; call it in a loop until it returns fewer
// than limit. Keep results at least as long as the broker can redeliver.
func (t *Table) Prune(ctx context.Context, db any, before time.Time, limit int) (int, error) {
	q, err := t.querier(db)
	if err != nil {
		return 0, err
	}
	var stmt string
	if t.dialect == Postgres {
		stmt = `DELETE FROM ` + t.name + ` WHERE ctid IN (SELECT ctid FROM ` + t.name + ` WHERE recorded_at < $1 LIMIT $2)`
	} else {
		stmt = `DELETE FROM ` + t.name + ` WHERE recorded_at < ? ORDER BY recorded_at LIMIT ?`
	}
	n, err := q.exec(ctx, stmt, before, limit)
	if err != nil {
		return 0, fmt.Errorf("effects: Prune %s: %w", t.name, err)
	}
	return int(n), nil
}

// querier hides the two driver APIs.
type querier interface {
	exec(ctx context.Context, sql string, args ...any) (int64, error) // rows affected
	queryBytes(ctx context.Context, sql string, args ...any) ([]byte, bool, error)
}

type pgxDB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type sqlDB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (t *Table) querier(db any) (querier, error) {
	switch t.dialect {
	case Postgres:
		if d, ok := db.(pgxDB); ok && db != nil {
			return pgxQ{d}, nil
		}
		return nil, fmt.Errorf("effects: a Postgres table needs a pgx handle (pgx.Tx, *pgxpool.Pool, *pgx.Conn), got %T", db)
	default:
		if d, ok := db.(sqlDB); ok && db != nil {
			return sqlQ{d}, nil
		}
		return nil, fmt.Errorf("effects: a MySQL table needs a database/sql handle (*sql.Tx, *sql.DB, *sql.Conn), got %T", db)
	}
}

type pgxQ struct{ db pgxDB }

func (q pgxQ) exec(ctx context.Context, s string, args ...any) (int64, error) {
	tag, err := q.db.Exec(ctx, s, args...)
	return tag.RowsAffected(), err
}

func (q pgxQ) queryBytes(ctx context.Context, s string, args ...any) ([]byte, bool, error) {
	return scanBytes(q.db.QueryRow(ctx, s, args...), pgx.ErrNoRows)
}

type sqlQ struct{ db sqlDB }

func (q sqlQ) exec(ctx context.Context, s string, args ...any) (int64, error) {
	r, err := q.db.ExecContext(ctx, s, args...)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

func (q sqlQ) queryBytes(ctx context.Context, s string, args ...any) ([]byte, bool, error) {
	return scanBytes(q.db.QueryRowContext(ctx, s, args...), sql.ErrNoRows)
}

// scanBytes reads row's one column, and whether there was a row: noRows is
// the driver's error for none.
func scanBytes(row interface{ Scan(...any) error }, noRows error) ([]byte, bool, error) {
	var b []byte
	err := row.Scan(&b)
	if errors.Is(err, noRows) {
		return nil, false, nil
	}
	return b, err == nil, err
}
