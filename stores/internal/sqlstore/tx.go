package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
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

// End is one open dedup transaction of an Engine: the claims, the
// handler's *sql.Tx, savepoints, commit and rollback. Like *sql.Tx it is
// used by one goroutine at a time.
type End struct {
	e    *Engine
	tx   *sql.Tx
	mode Returning
}

var _ Txn[*sql.Tx] = (*End)(nil)

// claimed is a claimed id's stored fingerprint and claim token.
type claimed struct {
	fp    string
	token int64
}

// Claim claims every id for consumer with one multi-row INSERT per
// Dialect.InsertChunk claims, in id order (so batches sharing ids lock
// them in the same order), stamping the rows it inserts with a random
// token and leaving a taken id's row as it is (Dialect.OnConflict), then
// learns the token and fingerprint of each row: the rows carrying this
// call's token were inserted by it (ClaimWon); the others were there
// already and are ClaimDuplicate, or ClaimMismatch when both fingerprints
// are non-empty and differ.
func (t *End) Claim(ctx context.Context, consumer string, claims []driver.Claim) ([]driver.ClaimResult, error) {
	e := t.e
	if err := e.check("Claim", consumer, claims); err != nil {
		return nil, err
	}
	results := make([]driver.ClaimResult, len(claims))
	if len(claims) == 0 {
		return results, nil
	}
	order := make([]int, len(claims))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(claims[a].ID, claims[b].ID) })
	token := rand.Int64N(1<<63-1) + 1 // never the column default 0
	now := formatTime(e.cfg.Now())
	got := make(map[string]claimed, len(claims))
	missing := func(chunk []int) (ids []string) {
		for _, i := range chunk {
			if _, ok := got[claims[i].ID]; !ok {
				ids = append(ids, claims[i].ID)
			}
		}
		return ids
	}
	for chunk := range slices.Chunk(order, e.d.InsertChunk) {
		if err := t.insert(ctx, consumer, now, token, claims, chunk, got); err != nil {
			return nil, fmt.Errorf("%s: claim %d ids for %q: %w", e.cfg.Store, len(chunk), consumer, err)
		}
		if ids := missing(chunk); len(ids) > 0 {
			if err := t.readBack(ctx, consumer, ids, "", got); err != nil {
				return nil, fmt.Errorf("%s: claim: read back %d ids for %q: %w", e.cfg.Store, len(ids), consumer, err)
			}
		}
		// A row committed by another transaction after this one's
		// REPEATABLE READ snapshot was taken is invisible to a plain read;
		// a locking read sees the latest version (and only waits on locks
		// the insert already holds). Where transactions hold the write
		// lock from BEGIN, no row can hide.
		if ids := missing(chunk); len(ids) > 0 && e.d.Lock != "" {
			if err := t.readBack(ctx, consumer, ids, e.d.Lock, got); err != nil {
				return nil, fmt.Errorf("%s: claim: locking read back %d ids for %q: %w", e.cfg.Store, len(ids), consumer, err)
			}
		}
	}
	for i, c := range claims {
		r, ok := got[c.ID]
		switch {
		case !ok:
			return nil, fmt.Errorf("%s: claim: no row came back for id %q", e.cfg.Store, c.ID)
		case r.token == token:
			results[i] = driver.ClaimWon
		default:
			results[i] = driver.ClassifyStored(c.Fingerprint, r.fp)
		}
	}
	return results, nil
}

// insert runs the INSERT of the claims of chunk (indexes into claims),
// and records in got the rows its RETURNING clause gives back.
func (t *End) insert(ctx context.Context, consumer, now string, token int64, claims []driver.Claim, chunk []int, got map[string]claimed) error {
	d := &t.e.d
	var b strings.Builder
	b.WriteString("INSERT INTO " + t.e.cfg.Table + " (consumer, processed_at, ")
	shared := []any{consumer, now}
	if d.Token != "" {
		b.WriteString(d.Token + ", ")
		shared = append(shared, token)
	}
	b.WriteString("message_id, fingerprint) VALUES ")
	args := make([]any, 0, len(shared)+(len(shared)+2)*len(chunk))
	if d.Numbered { // the shared values once, as ?1, ?2…
		args = append(args, shared...)
	}
	for j, i := range chunk {
		if j > 0 {
			b.WriteByte(',')
		}
		if d.Numbered {
			b.WriteByte('(')
			for k := range shared {
				fmt.Fprintf(&b, "?%d,", k+1)
			}
			n := len(shared) + 2*j
			fmt.Fprintf(&b, "?%d,?%d)", n+1, n+2)
		} else {
			b.WriteString("(" + strings.Repeat("?,", len(shared)) + "?,?)")
			args = append(args, shared...)
		}
		args = append(args, claims[i].ID, claims[i].Fingerprint)
	}
	b.WriteString(d.OnConflict)
	var id []byte // VARBINARY on MySQL; TEXT converts
	switch t.mode {
	case ReturnAll:
		// A row carrying this call's token (one it inserted) comes back
		// with NULL, which no stored fingerprint is (the column is NOT
		// NULL); any other row with its stored fingerprint, the one value
		// ClassifyStored needs of it.
		tok := strconv.FormatInt(token, 10) // an int64: safe as a literal
		b.WriteString(" RETURNING message_id, CASE WHEN " + d.Token + " = " + tok + " THEN NULL ELSE fingerprint END")
		var fp sql.NullString
		return scanEach(ctx, t.tx, b.String(), args, func() error {
			if fp.Valid {
				got[string(id)] = claimed{fp: fp.String}
			} else {
				got[string(id)] = claimed{token: token}
			}
			return nil
		}, &id, &fp)
	case ReturnInserted:
		b.WriteString(" RETURNING message_id")
		return scanEach(ctx, t.tx, b.String(), args, func() error { got[string(id)] = claimed{token: token}; return nil }, &id)
	}
	_, err := t.tx.ExecContext(ctx, b.String(), args...)
	return err
}

// readBack reads the claimed rows of ids, with lock ending the SELECT. The
// plain read takes no locks (a locking read of many keys takes next-key
// locks and deadlocks with concurrent inserts); the locking one is for
// rows the plain read could not see.
func (t *End) readBack(ctx context.Context, consumer string, ids []string, lock string, got map[string]claimed) error {
	col := t.e.d.Token
	if col == "" {
		col = "0" // a row found was not this call's: no token matches 0
	}
	q, args := t.e.inIDs("SELECT message_id, fingerprint, "+col+" FROM "+t.e.cfg.Table+" WHERE consumer = "+t.e.first()+" AND message_id IN ", consumer, ids)
	var id []byte
	var r claimed
	return scanEach(ctx, t.tx, q+lock, args, func() error { got[string(id)] = r; return nil }, &id, &r.fp, &r.token)
}

// Fence ends the leases in this transaction (driver.Fencer): it locks
// their rows (or holds the write lock already), deletes those whose token
// still matches, and reports ref for ref which did. The rows stay locked
// until the transaction ends, so a concurrent Acquire waits and then finds
// the completed claim.
func (t *End) Fence(ctx context.Context, consumer string, leases []driver.LeaseRef) ([]bool, error) {
	return t.e.fence(ctx, t.tx, consumer, leases)
}

// inIDs is listIDs in the engine's placeholder style.
func (e *Engine) inIDs(prefix, consumer string, ids []string) (string, []any) {
	return listIDs(e.d.Numbered, prefix, consumer, ids)
}

// listIDs returns prefix followed by a parenthesised placeholder per id, and
// the statement's arguments: consumer, then ids. With numbered the
// placeholders are ?2, ?3, … (the consumer is ?1 in prefix), otherwise ?.
func listIDs(numbered bool, prefix, consumer string, ids []string) (string, []any) {
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

// Unclaim deletes this consumer's claims of ids, for messages whose
// handler failed inside a batch transaction.
func (t *End) Unclaim(ctx context.Context, consumer string, ids []string) error {
	for part := range slices.Chunk(ids, t.e.d.ListChunk) {
		q, args := t.e.inIDs(t.e.unclaimSQL(), consumer, part)
		if _, err := t.tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("%s: unclaim %d ids for %q: %w", t.e.cfg.Store, len(part), consumer, err)
		}
	}
	return nil
}

// unclaimSQL is the DELETE of claims up to the list of ids.
func (e *Engine) unclaimSQL() string {
	return "DELETE FROM " + e.cfg.Table + " WHERE consumer = " + e.first() + " AND message_id IN "
}

func (t *End) exec(ctx context.Context, what string, stmts ...string) error {
	for _, s := range stmts {
		if _, err := t.tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %s: %w", t.e.cfg.Store, what, err)
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
func (t *End) Tx() *sql.Tx { return t.tx }

// ExecSQL runs a statement of another package in the transaction
// (driver.SQLTxn).
func (t *End) ExecSQL(ctx context.Context, query string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, query, args...)
	return err
}

// QueryRowSQL runs a query of another package in the transaction and
// scans its first row into dest; found is false when there is none
// (driver.SQLTxn).
func (t *End) QueryRowSQL(ctx context.Context, query string, args []any, dest ...any) (bool, error) {
	return scanRow(t.tx.QueryRowContext(ctx, query, args...), dest)
}

// Commit commits the claims and the handler's effects together.
func (t *End) Commit(context.Context) error {
	if err := t.tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", t.e.cfg.Store, err)
	}
	return nil
}

// Rollback aborts the transaction; after Commit (failed or not), or when
// Gone says the connection is gone, it does nothing and returns nil.
func (t *End) Rollback(context.Context) error {
	err := t.tx.Rollback()
	if err == nil || errors.Is(err, sql.ErrTxDone) || t.e.d.Errors.Gone != nil && t.e.d.Errors.Gone(err) {
		return nil
	}
	return fmt.Errorf("%s: rollback: %w", t.e.cfg.Store, err)
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
