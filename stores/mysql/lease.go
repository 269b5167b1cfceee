package mysql

import (
	"context"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// Acquire claims claim.ID for consumer as in progress until ttl from now
// (driver.Leaser), after checking consumer and id fit the key columns: see
// Store for the steps. The lease table is the dedup table's name followed
// by _leases; Migrate creates it.
func (s *Store) Acquire(ctx context.Context, consumer string, claim driver.Claim, ttl time.Duration) (driver.Lease, error) {
	if err := checkClaims("Acquire", consumer, []driver.Claim{claim}); err != nil {
		return driver.Lease{}, err
	}
	return s.Leaser.Acquire(ctx, consumer, claim, ttl)
}
