package outbox

import (
	"context"
	"time"
)

// Store is the database side of a Relay. pgoutbox, mysqloutbox and
// sqliteoutbox implement it; implement it only to add a database.
type Store interface {
	// Claim begins a transaction and locks up to limit pending rows for
	// this relay: the heads (oldest pending rows) of keys that no other
	// relay holds, looked for among the window oldest pending rows that are
	// not postponed, plus, under each head's lock, rows of the same key
	// that follow it. Rows come in Seq order. With no rows it returns a nil
	// Claimed.
	//
	// Parked rows are never claimed. With HoldKey a parked row still
	// counts as its key's head, so no later row of its key is claimed
	// (nor follows a head past it); with SkipParked the key's next pending
	// row is its head.
	Claim(ctx context.Context, limit, window int, parked ParkedKeyPolicy) (Claimed, error)
	// Pending counts the pending rows (not parked) and returns the age of
	// the oldest by the database clock (zero when none).
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
	// Finish records what became of the rows (see Outcome) and commits,
	// releasing every lock.
	Finish(ctx context.Context, o Outcome) error
	// Abort rolls back, releasing every lock; the rows stay pending.
	Abort(ctx context.Context) error
}

// Outcome is what a relay did with the rows of one claim, by Seq.
type Outcome struct {
	// Sent are the rows the broker confirmed: marked sent, or deleted when
	// Delete is set.
	Sent   []int64
	Delete bool
	// Failed are the rows whose publish failed, grouped by cause.
	Failed []Failure
}

// Failure is a set of rows whose publish failed with one cause. Each row's
// Attempts grows by one and its cause is recorded; then the row is parked
// (Park) or postponed: no relay claims it before RetryAfter has passed.
type Failure struct {
	Seqs       []int64
	Cause      string
	Park       bool
	RetryAfter time.Duration
}

// Notifier is implemented by stores that can tell a relay that rows were
// written (Postgres LISTEN/NOTIFY). Listen calls wake after each
// notification, and once after every (re)connection because notifications
// may have been missed, until ctx is done; it returns ctx's error or the
// error that made it give up.
type Notifier interface {
	Listen(ctx context.Context, wake func()) error
}

// Operator is the operator's side of an outbox table: inspecting, redriving
// and purging parked rows, and the table's backlog. The stores of
// pgoutbox, mysqloutbox and sqliteoutbox implement it; the idemq command's
// "outbox" subcommands use it.
type Operator interface {
	// Parked returns the parked rows that f selects, in Seq order.
	Parked(ctx context.Context, f ParkedFilter) ([]ParkedRow, error)
	// Redrive makes the parked rows that f selects pending again, at once:
	// their attempts start from zero and their cause is cleared. It returns
	// how many rows it redrove.
	Redrive(ctx context.Context, f ParkedFilter) (int64, error)
	// Purge deletes the parked rows that f selects, so their messages are
	// never published, and returns how many it deleted.
	Purge(ctx context.Context, f ParkedFilter) (int64, error)
	// Stats returns the table's backlog: pending and parked rows and the
	// keys that parked rows hold back.
	Stats(ctx context.Context) (TableStats, error)
}

// ParkedFilter selects parked rows. Its fields narrow the selection
// together; the zero value selects every parked row.
type ParkedFilter struct {
	// Seqs, when not empty, selects only these rows.
	Seqs []int64
	// Key, when not empty, selects only rows of this ordering key.
	Key string
	// Cause, when not empty, selects only rows whose cause contains it.
	Cause string
	// ParkedBefore, when not zero, selects only rows parked before it.
	ParkedBefore time.Time
	// ParkedAfter, when not zero, selects only rows parked after it.
	ParkedAfter time.Time
	// Limit, when positive, bounds how many rows Parked returns (Redrive
	// and Purge ignore it).
	Limit int
}

// ParkedRow is a parked outbox row as an operator sees it.
type ParkedRow struct {
	// Seq is the row's number in the table, what Redrive and Purge take.
	Seq         int64
	ID          string // the message's business id
	Destination string
	Key         string
	// Attempts counts the failed publishes.
	Attempts int
	// CreatedAt is when the row was written, ParkedAt when it was parked.
	CreatedAt time.Time
	ParkedAt  time.Time
	// Cause is the error of the last failed publish.
	Cause string
	// BodySize is the body's length in bytes.
	BodySize int64
}

// TableStats is an outbox table's backlog.
type TableStats struct {
	// Pending counts the rows waiting to be published (parked rows not
	// included); OldestPending is the age of the oldest of them by the
	// database clock (zero when none).
	Pending       int64
	OldestPending time.Duration
	// Parked counts the parked rows.
	Parked int64
	// HeldKeys counts the ordering keys that have a parked row with pending
	// rows behind it, and HeldRows those pending rows: with HoldKey they
	// wait until the parked row is redriven or purged.
	HeldKeys int64
	HeldRows int64
}
