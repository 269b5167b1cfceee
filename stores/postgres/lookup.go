package postgres

import (
	"context"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/stores/internal/sqlstore"

	"github.com/jackc/pgx/v5"
)

// Lookup reports, for each of ids in order, whether consumer has claimed
// it, when (processed_at) and with which fingerprint, and the lease of an
// id in progress (idemq lookup). It takes no locks that block claims. On a table made WithPartitions it
// looks in every partition; should an id have rows in two, the earliest
// claim is reported.
func (s *Store) Lookup(ctx context.Context, consumer string, ids []string) ([]admin.ClaimInfo, error) {
	if err := s.cfg.CheckConsumer("Lookup", consumer); err != nil {
		return nil, err
	}
	found := make(map[string]admin.ClaimInfo, len(ids))
	if len(ids) > 0 {
		rows, err := s.pool.Query(ctx, `SELECT DISTINCT ON (message_id) message_id, fingerprint, processed_at FROM `+s.cfg.Table+`
WHERE consumer = $1 AND message_id = ANY($2::text[]) ORDER BY message_id, processed_at`, customPlan, consumer, ids)
		if err != nil {
			return nil, s.cfg.Wrap("lookup", err)
		}
		var info admin.ClaimInfo
		_, err = pgx.ForEachRow(rows, []any{&info.ID, &info.Fingerprint, &info.At}, func() error {
			info.Claimed = true
			info.At = info.At.UTC()
			found[info.ID] = info
			return nil
		})
		if err != nil {
			return nil, s.cfg.Wrap("lookup", err)
		}
		if err := s.lookupLeases(ctx, consumer, ids, found); err != nil {
			return nil, s.cfg.Wrap("lookup", err)
		}
	}
	return sqlstore.InOrder(ids, found), nil
}

// Forget deletes consumer's leases of ids, then their claims in one
// statement, so those messages are applied again when they come (idemq
// forget), and returns how many claims it removed. On a table made WithPartitions it
// deletes from every partition.
func (s *Store) Forget(ctx context.Context, consumer string, ids []string) (int, error) {
	if err := s.cfg.CheckConsumer("Forget", consumer); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if err := s.forgetLeases(ctx, consumer, ids); err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, s.q.unclaim, customPlan, consumer, ids)
	if err != nil {
		return 0, s.cfg.Wrap("forget", err)
	}
	return int(tag.RowsAffected()), nil
}
