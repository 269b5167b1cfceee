package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idemq/idemq/core/driver"
)

// The savepoint a batch transaction sets before each message's handler:
// one name, since the Consumer keeps at most one alive at a time.
const (
	// SavepointSQL sets the savepoint.
	SavepointSQL = "SAVEPOINT idemq_sp"
	// RollbackToSQL undoes everything since the savepoint (and keeps it).
	RollbackToSQL = "ROLLBACK TO SAVEPOINT idemq_sp"
	// ReleaseSQL removes the savepoint, keeping its effects.
	ReleaseSQL = "RELEASE SAVEPOINT idemq_sp"
)

// End is the database/sql side of a dedup transaction that mysql and
// sqlite share: the handler's *sql.Tx, savepoints, commit and rollback.
// Their Txn types embed it, so these are their methods. Like *sql.Tx it is
// used by one goroutine at a time.
type End struct {
	// Store prefixes errors ("mysql: commit: …").
	Store string
	// SQL is the transaction.
	SQL *sql.Tx
	// Gone reports a rollback error that means the connection is gone, so
	// the server has rolled the transaction back already; nil when the
	// driver has none.
	Gone func(error) bool
	// Numbered says the driver takes numbered placeholders (?1, ?2: the
	// consumer is ?1 in every statement); otherwise they are plain ?.
	Numbered bool
	// Leases are the store's, for Fence.
	Leases *Leaser
}

// Fence ends the leases in this transaction (driver.Fencer): it locks
// their rows (or holds the write lock already), deletes those whose token
// still matches, and reports ref for ref which did. The rows stay locked
// until the transaction ends, so a concurrent Acquire waits and then finds
// the completed claim.
func (t *End) Fence(ctx context.Context, consumer string, leases []driver.LeaseRef) ([]bool, error) {
	return t.Leases.Cfg.Fence(ctx, t.SQL, t.Leases.Claims, consumer, leases)
}

// InIDs returns prefix followed by a parenthesised placeholder per id, and
// the statement's arguments: consumer, then ids.
func (t *End) InIDs(prefix, consumer string, ids []string) (string, []any) {
	return InIDs(t.Numbered, prefix, consumer, ids)
}

// InIDs returns prefix followed by a parenthesised placeholder per id, and
// the statement's arguments: consumer, then ids. With numbered the
// placeholders are ?2, ?3, … (the consumer is ?1 in prefix), otherwise ?.
func InIDs(numbered bool, prefix, consumer string, ids []string) (string, []any) {
	var b strings.Builder
	b.WriteString(prefix + "(")
	args := make([]any, 0, 1+len(ids))
	args = append(args, consumer)
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		if numbered {
			fmt.Fprintf(&b, "?%d", 2+i)
		} else {
			b.WriteByte('?')
		}
		args = append(args, id)
	}
	b.WriteByte(')')
	return b.String(), args
}

// Unclaim deletes consumer's claims of ids, chunk ids per statement;
// prefix is the statement up to the list of ids ("DELETE FROM t WHERE
// consumer = ? AND message_id IN ").
func (t *End) Unclaim(ctx context.Context, prefix, consumer string, ids []string, chunk int) error {
	for part := range slices.Chunk(ids, chunk) {
		q, args := t.InIDs(prefix, consumer, part)
		if _, err := t.SQL.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("%s: unclaim %d ids for %q: %w", t.Store, len(part), consumer, err)
		}
	}
	return nil
}

func (t *End) exec(ctx context.Context, what string, stmts ...string) error {
	for _, s := range stmts {
		if _, err := t.SQL.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %s: %w", t.Store, what, err)
		}
	}
	return nil
}

// Savepoint sets the savepoint RollbackToSavepoint returns to.
func (t *End) Savepoint(ctx context.Context) error { return t.exec(ctx, "savepoint", SavepointSQL) }

// RollbackToSavepoint undoes everything since Savepoint and removes the
// savepoint (ROLLBACK TO keeps it; releasing it keeps the savepoint stack
// from growing across a batch). Row locks taken since the savepoint stay
// until the transaction ends, as InnoDB does.
func (t *End) RollbackToSavepoint(ctx context.Context) error {
	if err := t.exec(ctx, "rollback to savepoint", RollbackToSQL); err != nil {
		return err
	}
	return t.exec(ctx, "release savepoint after rollback", ReleaseSQL)
}

// ReleaseSavepoint keeps everything since Savepoint.
func (t *End) ReleaseSavepoint(ctx context.Context) error {
	return t.exec(ctx, "release savepoint", ReleaseSQL)
}

// Tx returns the transaction for the handler's business effect.
func (t *End) Tx() *sql.Tx { return t.SQL }

// Commit commits the claims and the handler's effects together.
func (t *End) Commit(context.Context) error {
	if err := t.SQL.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", t.Store, err)
	}
	return nil
}

// Rollback aborts the transaction; after Commit (failed or not), or when
// Gone says the connection is gone, it does nothing and returns nil.
func (t *End) Rollback(context.Context) error {
	err := t.SQL.Rollback()
	if err == nil || errors.Is(err, sql.ErrTxDone) || t.Gone != nil && t.Gone(err) {
		return nil
	}
	return fmt.Errorf("%s: rollback: %w", t.Store, err)
}

// As is a store's As method: a *H target gets h (the store's pool or
// handle), a *S target the store s.
func As[H, S any](target any, h H, s S) bool {
	switch t := target.(type) {
	case *H:
		*t = h
		return true
	case *S:
		*t = s
		return true
	}
	return false
}

// CloseOwned is a database/sql store's Close: it closes db only when the
// store opened it (owned); a handle given to New is left to its owner.
func CloseOwned(db *sql.DB, owned bool) error {
	if !owned {
		return nil
	}
	return db.Close()
}
