package sqlite

import (
	"context"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// Acquire claims claim.ID for consumer as in progress until ttl from now
// (driver.Leaser), in a transaction of its own, which holds the write lock
// from BEGIN (as every transaction of a handle from Open): a SELECT of the
// lease row, then an INSERT of a new row or, for an expired row, an UPDATE
// with the next token; then a look-up of the dedup table, whose completed
// claim wins (LeaseDone or LeaseMismatch, rolled back). A completion
// transaction that fenced the lease holds the write lock until it ends,
// so Acquire waits for it (up to busy_timeout) and then finds its claim.
// The lease table is the dedup table's name followed by _leases; Migrate
// creates it.
func (s *Store) Acquire(ctx context.Context, consumer string, claim driver.Claim, ttl time.Duration) (driver.Lease, error) {
	return s.cfg.Acquire(ctx, s.claims(), consumer, claim, ttl)
}

// Renew moves the expiry of the leases whose tokens still hold them to ttl
// from now, in a transaction of its own, and reports ref for ref which
// are still held (driver.Leaser).
func (s *Store) Renew(ctx context.Context, consumer string, leases []driver.LeaseRef, ttl time.Duration) ([]bool, error) {
	return s.cfg.Renew(ctx, s.claims(), consumer, leases, ttl)
}

// Release deletes the lease if its token still holds it (driver.Leaser).
func (s *Store) Release(ctx context.Context, consumer string, lease driver.LeaseRef) error {
	return s.cfg.Release(ctx, s.claims(), consumer, lease)
}

// Fence ends the leases in this transaction (driver.Fencer): it deletes
// the lease rows whose token still matches, and reports which did.
func (t *Txn) Fence(ctx context.Context, consumer string, leases []driver.LeaseRef) ([]bool, error) {
	return t.s.cfg.Fence(ctx, t.End.SQL, t.s.claims(), consumer, leases)
}
