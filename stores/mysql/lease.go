package mysql

import (
	"context"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// Acquire claims claim.ID for consumer as in progress until ttl from now
// (driver.Leaser), in a READ COMMITTED transaction of its own: SELECT …
// FOR UPDATE of the lease row, then an INSERT of a new row (a duplicate
// key means a concurrent Acquire inserted it first: it is read again) or,
// for an expired row, an UPDATE with the next token; then, with the row
// locked, a look-up of the dedup table, whose completed claim wins
// (LeaseDone or LeaseMismatch, rolled back). The lease table is the dedup
// table's name followed by _leases; Migrate creates it.
func (s *Store) Acquire(ctx context.Context, consumer string, claim driver.Claim, ttl time.Duration) (driver.Lease, error) {
	if err := checkClaims("Acquire", consumer, []driver.Claim{claim}); err != nil {
		return driver.Lease{}, err
	}
	return s.cfg.Acquire(ctx, s.claims(), consumer, claim, ttl)
}

// Renew moves the expiry of the leases whose tokens still hold them to ttl
// from now, in a transaction of its own that locks their rows, and
// reports ref for ref which are still held (driver.Leaser).
func (s *Store) Renew(ctx context.Context, consumer string, leases []driver.LeaseRef, ttl time.Duration) ([]bool, error) {
	return s.cfg.Renew(ctx, s.claims(), consumer, leases, ttl)
}

// Release deletes the lease if its token still holds it (driver.Leaser).
func (s *Store) Release(ctx context.Context, consumer string, lease driver.LeaseRef) error {
	return s.cfg.Release(ctx, s.claims(), consumer, lease)
}

// Fence ends the leases in this transaction (driver.Fencer): SELECT … FOR
// UPDATE of their rows, then a DELETE of those whose token still matches
// (portable to MySQL 8, which has no DELETE … RETURNING). The rows stay
// locked until the transaction ends.
func (t *Txn) Fence(ctx context.Context, consumer string, leases []driver.LeaseRef) ([]bool, error) {
	return t.s.cfg.Fence(ctx, t.End.SQL, t.s.claims(), consumer, leases)
}
