package driver

import (
	"context"
	"time"
)

// LeaseResult is the outcome of asking for a leased claim.
type LeaseResult int

const (
	// LeaseWon means the caller now holds the claim in progress, under a
	// fresh fencing token: no lease existed, or the one that did had
	// expired and was taken over.
	LeaseWon LeaseResult = iota + 1
	// LeaseBusy means another holder's lease on the id is live: the
	// message is redelivered later, neither applied nor acknowledged.
	LeaseBusy
	// LeaseDone means a completed claim of the id exists: the message is a
	// Duplicate.
	LeaseDone
	// LeaseMismatch means a completed claim of the id exists with a
	// different body fingerprint (see ClassifyStored).
	LeaseMismatch
)

// String returns the result's name.
func (r LeaseResult) String() string {
	switch r {
	case LeaseWon:
		return "won"
	case LeaseBusy:
		return "busy"
	case LeaseDone:
		return "done"
	case LeaseMismatch:
		return "mismatch"
	}
	return "unknown"
}

// Lease is what Acquire reports.
type Lease struct {
	Result LeaseResult
	// Token is the fencing token of a won lease: it changes with every
	// holder, so a holder whose lease was taken over cannot complete.
	Token int64
	// Until is when the lease expires, by the store's clock: the caller's
	// for LeaseWon, the holder's for LeaseBusy; zero otherwise.
	Until time.Time
	// TakenOver reports a LeaseWon that replaced an expired lease (its
	// holder crashed or hung), as opposed to a first claim.
	TakenOver bool
}

// LeaseRef names one lease a caller holds.
type LeaseRef struct {
	ID    string
	Token int64
}

// Leaser is implemented by stores that can hold a claim in progress
// outside any transaction, for consumers whose effect is a slow external
// call (core.NewLeased). A leased claim lives apart from the completed
// claims that Txn.Claim inserts: it never blocks a claimer, expires by
// itself, and a completed claim of the same id always wins over it.
// Prune never removes a lease that has not expired.
//
// Every method runs in a short transaction of its own and commits before
// it returns.
type Leaser interface {
	// Acquire claims c.ID for consumer as in progress until ttl from now:
	// LeaseDone or LeaseMismatch when a completed claim exists (no lease
	// is left behind), LeaseBusy when a live lease exists, otherwise
	// LeaseWon with a new token, taking over an expired lease.
	Acquire(ctx context.Context, consumer string, c Claim, ttl time.Duration) (Lease, error)
	// Renew moves the expiry of the leases still held by their tokens to
	// ttl from now, and reports, ref for ref, whether each is still held
	// (false: it was taken over or released). An expired lease that no one
	// took over is still held and is renewed.
	Renew(ctx context.Context, consumer string, leases []LeaseRef, ttl time.Duration) ([]bool, error)
	// Release deletes the lease if token still holds it, so the next
	// delivery of the id acquires it at once. It is not an error when the
	// lease is gone.
	Release(ctx context.Context, consumer string, lease LeaseRef) error
}

// Fencer is implemented by the transactions of Leaser stores. Fence ends
// the leases, inside the transaction that completes their messages (and
// inserts their claims with Claim), and reports, ref for ref, whether the
// token still held the lease. A false means another consumer took the
// lease over: the caller must not commit that message's effects (it
// deletes its claim with Unclaim, or rolls back). The deleted lease rows
// stay locked until the transaction ends, so a concurrent Acquire waits
// and then finds the completed claim.
type Fencer interface {
	Fence(ctx context.Context, consumer string, leases []LeaseRef) ([]bool, error)
}
