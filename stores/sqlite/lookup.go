package sqlite

import (
	"context"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// claims is where Lookup and Forget find the claims, and the lease
// methods the leases. Their transactions take the write lock at BEGIN (as
// Open configures the handle), so the rows they read need no lock of
// their own.
func (s *Store) claims() sqlstore.Claims {
	return sqlstore.Claims{DB: s.db, Numbered: true, Chunk: 2 * claimChunk, NoLeases: noSuchTable}
}

// Lookup reports, for each of ids in order, whether consumer has claimed
// it, when (processed_at) and with which fingerprint, and the lease of an
// id in progress (idemq lookup). It reads without taking the write lock.
func (s *Store) Lookup(ctx context.Context, consumer string, ids []string) ([]admin.ClaimInfo, error) {
	return s.cfg.Lookup(ctx, s.claims(), `SELECT message_id, fingerprint, processed_at FROM `+s.cfg.Table+
		` WHERE consumer = ?1 AND message_id IN `, consumer, ids)
}

// Forget deletes consumer's claims and leases of ids in one transaction,
// so those messages are applied again when they come (idemq forget), and
// returns how many claims it removed.
func (s *Store) Forget(ctx context.Context, consumer string, ids []string) (int, error) {
	return s.cfg.Forget(ctx, s.claims(), s.q.unclaim, consumer, ids)
}
