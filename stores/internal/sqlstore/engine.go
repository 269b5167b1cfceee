package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// Engine is a database/sql dedup store, parameterised by its Dialect:
// mysql and sqlite embed it, so its methods are theirs. It is safe for
// concurrent use.
type Engine struct {
	d     Dialect
	cfg   *Config
	db    *sql.DB
	owned bool // Close closes db only when the store's Open opened it

	modeMu sync.Mutex
	moded  bool // d.Returning holds what d.Mode answered
}

// NewEngine returns the engine of a store on db, with the store's config
// (which the store keeps) and dialect.
func NewEngine(db *sql.DB, cfg *Config, d Dialect) *Engine {
	return &Engine{d: d, cfg: cfg, db: db}
}

// Opened ends a store's Open on the handle its Open opened, which Close
// then closes: unless NoMigrate is set it runs Migrate, and when that
// fails closes the handle and returns the error.
func Opened[S any](ctx context.Context, e *Engine, s S) (S, error) {
	e.owned = true
	if !e.cfg.NoMigrate {
		if err := e.Migrate(ctx); err != nil {
			e.db.Close()
			var none S
			return none, err
		}
	}
	return s, nil
}

// DB returns the database handle, for business tables and queries outside
// a claim.
func (e *Engine) DB() *sql.DB { return e.db }

// SQLDialect names the database's SQL (driver.SQLStore).
func (e *Engine) SQLDialect() driver.SQLDialect { return e.d.SQL }

// ExecSQL runs a statement of another package on the pool and returns how
// many rows it affected (driver.SQLStore).
func (e *Engine) ExecSQL(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := e.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// QueryRowSQL runs a query of another package on the pool and scans its
// first row into dest; found is false when there is none
// (driver.SQLStore).
func (e *Engine) QueryRowSQL(ctx context.Context, query string, args []any, dest ...any) (bool, error) {
	return scanRow(e.db.QueryRowContext(ctx, query, args...), dest)
}

// scanRow scans row into dest, telling no row from an error.
func scanRow(row *sql.Row, dest []any) (bool, error) {
	err := row.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// Ping checks that the database answers, with one round trip.
func (e *Engine) Ping(ctx context.Context) error { return e.db.PingContext(ctx) }

// Conflict implements driver.Conflicter with the dialect's Errors.Conflict.
func (e *Engine) Conflict(err error) bool { return e.d.Errors.is(err, e.d.Errors.Conflict) }

// Close closes the database handle if Open opened it; a handle given to
// New is left to its owner.
func (e *Engine) Close() error {
	if !e.owned {
		return nil
	}
	return e.db.Close()
}

// Table returns the dedup table's name (WithTable).
func (e *Engine) Table() string { return e.cfg.Table }

// Retention returns how long claims are kept (WithRetention).
func (e *Engine) Retention() time.Duration { return e.cfg.Retention }

// Migrate creates the dedup table and its processed_at index, and the
// lease table next to it (see Acquire), if they do not exist. It is
// idempotent. A table name too long for its lease table (more than 56
// characters) gets no lease table; Acquire then fails naming WithTable.
func (e *Engine) Migrate(ctx context.Context) error {
	stmts := e.d.Tables(e.cfg.Table)
	if lt, err := e.cfg.LeaseTable(); err == nil {
		stmts = append(slices.Clip(stmts), e.d.LeaseTables(lt)...)
	}
	run := e.d.RunDDL
	if run == nil {
		run = ddlInTx
	}
	if err := run(ctx, e.db, e.cfg.Table, stmts); err != nil {
		return e.cfg.Wrap("migrate", err)
	}
	return nil
}

func ddlInTx(ctx context.Context, db *sql.DB, _ string, stmts []string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, stmt := range stmts {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// Prune deletes at most limit claims recorded before the given time (rows
// at or after it are kept), oldest first, in one short statement, and
// returns how many it deleted. Call it again until it returns less than
// limit. Once no such claim is left, it deletes, within the same limit,
// the leases that expired before the given time and before now: never a
// live lease, whatever the time given.
func (e *Engine) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := e.cfg.CheckLimit(limit); err != nil {
		return 0, err
	}
	q, args := e.d.DeleteOldest(e.cfg.Table, "processed_at", limit)
	n, err := execCount(ctx, e.db, q, append([]any{formatTime(before)}, args...)...)
	if err != nil {
		return 0, e.cfg.Wrap("prune", err)
	}
	lt, err := e.cfg.LeaseTable()
	if n == limit || err != nil {
		return n, nil
	}
	q, args = e.d.DeleteOldest(lt, "lease_until", limit-n)
	m, err := execCount(ctx, e.db, q, append([]any{formatTime(e.cfg.LeaseCut(before))}, args...)...)
	if err := e.skipNoLeases(err); err != nil {
		return n, e.cfg.Wrap("prune", err)
	}
	return n + m, nil
}

// RunPruner deletes claims older than Retention every interval, in batches
// of batch rows (each its own short statement) until a batch comes back
// short, and logs how many it removed. It returns ctx's error when ctx is
// done; a failed round is logged and retried at the next tick.
func (e *Engine) RunPruner(ctx context.Context, every time.Duration, batch int, logger *slog.Logger) error {
	return e.cfg.RunPruner(ctx, e, every, batch, logger)
}

// Begin starts a dedup transaction.
func (e *Engine) Begin(ctx context.Context) (driver.Txn[*sql.Tx], error) {
	mode, err := e.returning(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := e.db.BeginTx(ctx, e.d.BeginTx)
	if err != nil {
		return nil, fmt.Errorf("%s: begin: %w", e.cfg.Store, err)
	}
	return &End{e: e, tx: tx, mode: mode}, nil
}

// returning is what the claims' INSERT returns, asking Dialect.Mode once.
func (e *Engine) returning(ctx context.Context) (Returning, error) {
	if e.d.Mode == nil {
		return e.d.Returning, nil
	}
	e.modeMu.Lock()
	defer e.modeMu.Unlock()
	if !e.moded {
		m, err := e.d.Mode(ctx)
		if err != nil {
			return 0, err
		}
		e.d.Returning, e.moded = m, true
	}
	return e.d.Returning, nil
}

// check checks the consumer and claims of a call op (Dialect.Check).
func (e *Engine) check(op, consumer string, claims []driver.Claim) error {
	if e.d.Check != nil {
		return e.d.Check(op, consumer, claims)
	}
	return e.cfg.CheckConsumer(op, consumer)
}

// first is the placeholder of a statement's first argument, the consumer.
func (e *Engine) first() string {
	if e.d.Numbered {
		return "?1"
	}
	return "?"
}

// timeText reads the time expression expr as timeFormat text.
func (e *Engine) timeText(expr string) string {
	if e.d.TimeText == nil {
		return expr
	}
	return e.d.TimeText(expr)
}

// skipNoLeases returns nil for an error that says the lease table is not
// there or not the user's (Errors.NoTable), err otherwise.
func (e *Engine) skipNoLeases(err error) error {
	if e.d.Errors.is(err, e.d.Errors.NoTable) {
		return nil
	}
	return err
}

// querier is a *sql.DB, *sql.Conn or *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// scanEach runs query on q and scans each row into dest, calling f after
// each.
func scanEach(ctx context.Context, q querier, query string, args []any, f func() error, dest ...any) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if err := f(); err != nil {
			return err
		}
	}
	if err := rows.Close(); err != nil {
		return err
	}
	return rows.Err()
}
