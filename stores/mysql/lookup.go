package mysql

import (
	"context"
	"database/sql"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// claims is where Lookup and Forget find the claims, and the lease
// methods the leases: their own transactions are READ COMMITTED, so that
// the look-up of the dedup table after a lease row's lock sees a claim
// committed while it waited.
func (s *Store) claims() sqlstore.Claims {
	return sqlstore.Claims{DB: s.db, Chunk: claimChunk,
		LeaseTx: &sql.TxOptions{Isolation: sql.LevelReadCommitted}, Lock: " FOR UPDATE", TimeText: timeText, Taken: duplicateKey, NoLeases: noLeases}
}

// timeText reads a DATETIME(6) column written as UTC text back as text, so
// that the driver's parseTime and loc settings do not matter.
func timeText(col string) string { return `DATE_FORMAT(` + col + `, '%Y-%m-%d %H:%i:%s.%f')` }

// Lookup reports, for each of ids in order, whether consumer has claimed
// it, when (processed_at) and with which fingerprint, and the lease of an
// id in progress (idemq lookup). It is a plain consistent read: it takes
// no locks that block claims.
func (s *Store) Lookup(ctx context.Context, consumer string, ids []string) ([]admin.ClaimInfo, error) {
	return s.cfg.Lookup(ctx, s.claims(), `SELECT message_id, fingerprint, `+timeText("processed_at")+` FROM `+
		s.cfg.Table+` WHERE consumer = ? AND message_id IN `, consumer, ids)
}

// Forget deletes consumer's claims and leases of ids in one transaction,
// so those messages are applied again when they come (idemq forget), and
// returns how many claims it removed.
func (s *Store) Forget(ctx context.Context, consumer string, ids []string) (int, error) {
	return s.cfg.Forget(ctx, s.claims(), "DELETE FROM "+s.cfg.Table+" WHERE consumer = ? AND message_id IN ", consumer, ids)
}
