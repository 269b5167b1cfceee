package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Queue adds a statement to the handler's transaction without a round trip
// of its own: the statements of every message in a batch go to the server
// together, in one pgx.Batch, before the commit. This is how per-message
// handlers reach the throughput of a hand-written set-based batch.
//
// Use it for writes whose result the handler does not need (UPDATE, INSERT,
// DELETE). Queued statements run in the order queued; any other statement
// the handler runs on tx first sends what is queued, so reads see earlier
// writes. An error of a queued statement fails the whole batch, which the
// Consumer then decides message by message to pin it on the right one.
//
// On a pgx.Tx that did not come from this store, Queue runs the statement
// at once.
func Queue(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
	q, ok := tx.(*queuingTx)
	if !ok {
		_, err := tx.Exec(ctx, sql, args...)
		return err
	}
	q.batch.Queue(sql, args...)
	return nil
}

// queuingTx is the pgx.Tx handlers get: the store's transaction plus the
// statements queued on it.
type queuingTx struct {
	pgx.Tx
	batch pgx.Batch
}

func (q *queuingTx) flush(ctx context.Context) error {
	n := q.batch.Len()
	if n == 0 {
		return nil
	}
	b := q.batch
	q.batch = pgx.Batch{}
	br := q.Tx.SendBatch(ctx, &b)
	var first error
	for i := 0; i < n; i++ {
		if _, err := br.Exec(); err != nil && first == nil {
			first = fmt.Errorf("postgres: queued statement %d of %d (%s): %w", i+1, n, shorten(b.QueuedQueries[i].SQL), err)
		}
	}
	if err := br.Close(); err != nil && first == nil {
		first = err
	}
	return first
}

func (q *queuingTx) discard() { q.batch = pgx.Batch{} }

func shorten(sql string) string {
	if len(sql) > 60 {
		return sql[:60] + "…"
	}
	return sql
}

// The methods below send what is queued first, so that statements keep
// the order the handler wrote them in.

// Exec implements pgx.Tx.
func (q *queuingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := q.flush(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return q.Tx.Exec(ctx, sql, args...)
}

// Query implements pgx.Tx.
func (q *queuingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := q.flush(ctx); err != nil {
		return nil, err
	}
	return q.Tx.Query(ctx, sql, args...)
}

// QueryRow implements pgx.Tx.
func (q *queuingTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := q.flush(ctx); err != nil {
		return errRow{err}
	}
	return q.Tx.QueryRow(ctx, sql, args...)
}

// SendBatch implements pgx.Tx.
func (q *queuingTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := q.flush(ctx); err != nil {
		return errBatch{err}
	}
	return q.Tx.SendBatch(ctx, b)
}

// CopyFrom implements pgx.Tx.
func (q *queuingTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := q.flush(ctx); err != nil {
		return 0, err
	}
	return q.Tx.CopyFrom(ctx, table, cols, src)
}

// Commit flushes, then commits: a handler that commits its own transaction
// is a bug, but queued statements must not be lost to it.
func (q *queuingTx) Commit(ctx context.Context) error {
	if err := q.flush(ctx); err != nil {
		return err
	}
	return q.Tx.Commit(ctx)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow{b.err} }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

// failedTx stands in for a transaction that could not begin: every call
// reports why.
type failedTx struct {
	pgx.Tx
	err error
}

func (f failedTx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, f.err
}
func (f failedTx) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, f.err }
func (f failedTx) QueryRow(context.Context, string, ...any) pgx.Row        { return errRow{f.err} }
func (f failedTx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults  { return errBatch{f.err} }
func (f failedTx) Commit(context.Context) error                            { return f.err }
func (f failedTx) Rollback(context.Context) error                          { return nil }
