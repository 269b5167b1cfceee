package postgres

import (
	"context"
	"errors"

	"github.com/idemq/idemq/core/driver"
	"github.com/jackc/pgx/v5"
)

// SQLDialect names PostgreSQL's SQL (driver.SQLStore).
func (s *Store) SQLDialect() driver.SQLDialect { return driver.DialectPostgres }

// ExecSQL runs a statement of another package on the pool and returns how
// many rows it affected (driver.SQLStore).
func (s *Store) ExecSQL(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := s.pool.Exec(ctx, query, args...)
	return tag.RowsAffected(), err
}

// QueryRowSQL runs a query of another package on the pool and scans its
// first row into dest; found is false when there is none
// (driver.SQLStore).
func (s *Store) QueryRowSQL(ctx context.Context, query string, args []any, dest ...any) (bool, error) {
	return scanRow(s.pool.QueryRow(ctx, query, args...), dest)
}

// BusyClaims reports that the store's transactions claim without waiting
// for another's uncommitted claim (driver.BusyClaimStore).
func (s *Store) BusyClaims() bool { return true }

// ExecSQL queues a statement of another package to go with the commit,
// as Queue does (driver.SQLTxn): FlushCommit reports its error.
func (t *Txn) ExecSQL(ctx context.Context, query string, args ...any) error {
	return Queue(ctx, t.Tx(), query, args...)
}

// QueryRowSQL runs a query of another package in the transaction, after
// the statements queued, and scans its first row into dest; found is false
// when there is none (driver.SQLTxn).
func (t *Txn) QueryRowSQL(ctx context.Context, query string, args []any, dest ...any) (bool, error) {
	return scanRow(t.Tx().QueryRow(ctx, query, args...), dest)
}

// scanRow scans row into dest, telling no row from an error.
func scanRow(row pgx.Row, dest []any) (bool, error) {
	err := row.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
