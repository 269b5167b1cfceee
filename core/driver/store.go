package driver

import (
	"context"
	"errors"
	"time"
)

// Store is a dedup store: it opens the transaction that holds both the
// claim of a message id and the handler's business effect. Tx is the
// handle handlers receive: pgx.Tx for Postgres, *sql.Tx for MySQL and
// SQLite. The Consumer takes it; core.OpenStore opens one by URL.
type Store[Tx any] interface {
	// Begin opens a dedup transaction.
	Begin(ctx context.Context) (Txn[Tx], error)
	// Close releases the store's connections (those it opened itself;
	// a pool the caller handed in stays open).
	Close() error
	// As sets target, a pointer to a type the store documents (its
	// connection pool: **pgxpool.Pool, **sql.DB), and reports whether it
	// could, in the way gocloud.dev's As methods hand out what lies
	// beneath a portable type.
	As(target any) bool
}

// Claim asks a Txn to claim one message id for a consumer.
type Claim struct {
	// ID is the message's business id.
	ID string
	// Fingerprint identifies the body (see Fingerprint). Empty disables
	// the mismatch check for this claim.
	Fingerprint string
}

// ClaimResult is the outcome of claiming one id.
type ClaimResult int

const (
	// ClaimWon means this transaction inserted the id: the handler runs.
	ClaimWon ClaimResult = iota + 1
	// ClaimDuplicate means the id was already committed by another
	// transaction (or earlier): the message is a Duplicate.
	ClaimDuplicate
	// ClaimMismatch means the id was already committed with a different
	// body fingerprint: the same id was reused for another message.
	ClaimMismatch
)

// String returns the result's name.
func (r ClaimResult) String() string {
	switch r {
	case ClaimWon:
		return "won"
	case ClaimDuplicate:
		return "duplicate"
	case ClaimMismatch:
		return "mismatch"
	}
	return "unknown"
}

// Txn is one open dedup transaction. It is used by one goroutine at a time.
//
// A store's Claim must make a second transaction claiming the same
// (consumer, id) wait until the first commits (then ClaimDuplicate) or
// rolls back (then ClaimWon): the unique key is the lock. Claim must not
// leave the transaction unusable when an id is taken (no caught
// unique-violation inside an aborted Postgres transaction).
type Txn[Tx any] interface {
	// Tx returns the handle the handler uses for its business effect.
	Tx() Tx
	// Claim claims every id for consumer in one statement where the
	// database allows, returning one result per claim in order. The ids of
	// one call are distinct (the Consumer guarantees it). The Consumer
	// reuses claims once Claim returns: a store keeps none of it.
	Claim(ctx context.Context, consumer string, claims []Claim) ([]ClaimResult, error)
	// Unclaim deletes claims this transaction made, for messages whose
	// handler failed inside a batch: their effects were rolled back to a
	// savepoint and their claims must go with them.
	Unclaim(ctx context.Context, consumer string, ids []string) error
	// Commit commits the transaction.
	Commit(ctx context.Context) error
	// Rollback aborts the transaction. It is safe to call after Commit or
	// a failed Commit.
	Rollback(ctx context.Context) error
}

// ErrClaimBusy is returned, wrapped, by BusyClaimer.ClaimOrBusy when
// another open transaction holds one of the ids.
var ErrClaimBusy = errors.New("another open transaction holds the claim")

// BusyClaimer is implemented by transactions that can claim without
// waiting for a concurrent claimer, for callers that answer "in progress"
// instead of waiting (an HTTP request's copy gets 409 while the first runs).
type BusyClaimer interface {
	// ClaimOrBusy is Claim, except that when another open transaction
	// holds one of the ids it waits at most wait, then fails with an error
	// wrapping ErrClaimBusy; the transaction is then unusable and must be
	// rolled back. Statements after the claim wait for locks as usual.
	ClaimOrBusy(ctx context.Context, consumer string, claims []Claim, wait time.Duration) ([]ClaimResult, error)
}

// BusyClaimStore is implemented by stores whose transactions are all
// BusyClaimers, so that a caller can choose before it begins one how a
// claim in progress is held: by the claim of a transaction not yet
// committed, which copies give up on (ClaimOrBusy), or by a lease
// (Leaser). Package idempotency holds a key in progress the first way on
// such a store.
type BusyClaimStore interface {
	// BusyClaims reports whether the store's transactions implement
	// BusyClaimer.
	BusyClaims() bool
}

// Savepointer is implemented by transactions that can roll back part of
// themselves. The Consumer uses it only under core.IsolateSavepoints, to
// keep a failed handler's effects and claim apart from the rest of its
// batch. Savepoints are not nested by the Consumer: each is released or
// rolled back before the next is made.
type Savepointer interface {
	// Savepoint marks a point the transaction can roll back to.
	Savepoint(ctx context.Context) error
	// RollbackToSavepoint undoes everything since the last Savepoint and
	// leaves the transaction usable.
	RollbackToSavepoint(ctx context.Context) error
	// ReleaseSavepoint keeps everything since the last Savepoint.
	ReleaseSavepoint(ctx context.Context) error
}

// Retentioner is implemented by stores that know how long claims are kept,
// so the Consumer can compare it with the broker's redelivery horizon.
type Retentioner interface {
	Retention() time.Duration
}

// ClassifyStored decides, for an id already claimed with the stored
// fingerprint, between ClaimDuplicate and ClaimMismatch: a mismatch needs
// both fingerprints non-empty, of the same length, and different. Claims
// made without a fingerprint never turn into dead letters; fingerprints of
// different lengths come from different functions (the 64-character hex
// SHA-256 of earlier idemq versions, or a changed WithFingerprint) and are
// not compared, so an upgrade does not dead-letter the redeliveries of
// messages claimed before it. Stores call it; the Postgres store's claim
// statement applies the same rule in SQL.
func ClassifyStored(claimed, stored string) ClaimResult {
	if claimed != "" && stored != "" && len(claimed) == len(stored) && claimed != stored {
		return ClaimMismatch
	}
	return ClaimDuplicate
}

// Pinger is implemented by stores that can check they answer with one
// round trip to the database. The Consumer pings a store whose transaction
// failed, to tell an outage (pause until it answers) from one failed
// transaction; a store without Ping is probed by opening and rolling back a
// transaction, which proves nothing for a store that opens its
// transactions lazily, with the first statement.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Flusher is implemented by transactions that queue statements to send in
// one round trip (Postgres: statements queued by handlers into a pgx.Batch).
// The Consumer calls Flush after the handlers of a batch and before Commit.
// A Flush error cannot be pinned on one message, so the Consumer then
// decides each message of the batch alone, in its own transaction.
type Flusher interface {
	Flush(ctx context.Context) error
}

// FlushCommitter is implemented by transactions that can send the
// statements still queued and the COMMIT in one round trip. Where the
// Consumer would call Flush and then Commit, it calls FlushCommit instead.
// A queued statement's failure comes back as a *FlushError (nothing was
// committed), which the Consumer decides like a Flush error; any other
// error is a Commit error.
type FlushCommitter interface {
	FlushCommit(ctx context.Context) error
}

// FlushError is a queued statement's failure reported by FlushCommit: the
// transaction did not commit.
type FlushError struct {
	Err error
}

// Error returns the statement's error text.
func (e *FlushError) Error() string { return e.Err.Error() }

// Unwrap returns the statement's error.
func (e *FlushError) Unwrap() error { return e.Err }

// Conflicter is implemented by stores that can tell an error that aborted a
// whole transaction because of a concurrent one (a deadlock, a
// serialization failure, a Galera certification conflict), wherever it
// arose, a handler's statement included. The transaction was rolled back
// and a new one may not meet it, so the Consumer runs it again in place, a
// few times, spending no delivery attempt, before it decides Retry.
type Conflicter interface {
	Conflict(err error) bool
}
