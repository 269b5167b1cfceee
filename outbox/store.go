package outbox

import (
	"context"
	"time"
)

// Store is the database side of a Relay. pgoutbox and mysqloutbox
// implement it; implement it only to add a database.
type Store interface {
	// Claim begins a transaction and locks up to limit pending rows for
	// this relay: the heads (oldest pending rows) of keys that no other
	// relay holds, looked for among the window oldest pending rows that are
	// not postponed, plus,
	// under each head's lock, rows of the same key that follow it. Rows
	// come in Seq order. With no rows it returns a nil Claimed.
	Claim(ctx context.Context, limit, window int) (Claimed, error)
	// Pending counts the pending rows and returns the age of the oldest by
	// the database clock (zero when none).
	Pending(ctx context.Context) (count int64, oldestAge time.Duration, err error)
	// Prune deletes at most limit rows sent before the given time, in one
	// short transaction, and returns how many it deleted.
	Prune(ctx context.Context, before time.Time, limit int) (int, error)
}

// Claimed is one claim transaction: the locked rows, until Finish or
// Abort.
type Claimed interface {
	// Rows returns the claimed rows in Seq order.
	Rows() []*Row
	// Finish marks the rows whose seqs are in sent as sent (or deletes
	// them when del is set), postpones the rows in failed (their Attempts
	// grow by one and no relay claims them before retryAfter has passed),
	// and commits, releasing every lock.
	Finish(ctx context.Context, sent, failed []int64, retryAfter time.Duration, del bool) error
	// Abort rolls back, releasing every lock; the rows stay pending.
	Abort(ctx context.Context) error
}

// Notifier is implemented by stores that can tell a relay that rows were
// written (Postgres LISTEN/NOTIFY). Listen calls wake after each
// notification, and once after every (re)connection because notifications
// may have been missed, until ctx is done; it returns ctx's error or the
// error that made it give up.
type Notifier interface {
	Listen(ctx context.Context, wake func()) error
}
