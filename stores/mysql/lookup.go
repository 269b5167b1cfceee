package mysql

import (
	"context"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// claims is where Lookup and Forget find the claims.
func (s *Store) claims() sqlstore.Claims {
	return sqlstore.Claims{DB: s.db, Chunk: claimChunk}
}

// Lookup reports, for each of ids in order, whether consumer has claimed
// it, when (processed_at) and with which fingerprint (idemq lookup). It is
// a plain consistent read: it takes no locks that block claims.
func (s *Store) Lookup(ctx context.Context, consumer string, ids []string) ([]driver.ClaimInfo, error) {
	// processed_at is written as UTC text; read it back as text too, so
	// the driver's parseTime and loc settings do not matter.
	return s.cfg.Lookup(ctx, s.claims(), `SELECT message_id, fingerprint, DATE_FORMAT(processed_at, '%Y-%m-%d %H:%i:%s.%f') FROM `+
		s.cfg.Table+` WHERE consumer = ? AND message_id IN `, consumer, ids)
}

// Forget deletes consumer's claims of ids in one transaction, so those
// messages are applied again when they come (idemq forget), and returns
// how many claims it removed.
func (s *Store) Forget(ctx context.Context, consumer string, ids []string) (int, error) {
	return s.cfg.Forget(ctx, s.claims(), "DELETE FROM "+s.cfg.Table+" WHERE consumer = ? AND message_id IN ", consumer, ids)
}
