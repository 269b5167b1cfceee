package postgres

import (
	"context"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/stores/internal/sqlstore"

	"github.com/jackc/pgx/v5"
)

// Inspect describes the dedup table for operators (idemq stats): claims
// and oldest/newest processed_at per consumer, the claims in progress
// (leases, and how many of them expired), and the table's size on
// disk with its indexes (summed over partitions for a table made
// WithPartitions). It counts every row, so on a very large table it takes
// as long as a sequential scan; it takes no locks that block claims.
func (s *Store) Inspect(ctx context.Context) (admin.TableStats, error) {
	st := admin.TableStats{Table: s.cfg.Table}
	wrap := func(err error) error { return s.cfg.Wrap("inspect", err) }
	rows, err := s.pool.Query(ctx, `SELECT consumer, count(*), min(processed_at), max(processed_at)
FROM `+s.cfg.Table+` GROUP BY consumer ORDER BY consumer`)
	if err != nil {
		return st, wrap(err)
	}
	var c admin.ConsumerStats
	_, err = pgx.ForEachRow(rows, []any{&c.Consumer, &c.Rows, &c.Oldest, &c.Newest}, func() error {
		st.Consumers = append(st.Consumers, c)
		st.Rows += c.Rows
		return nil
	})
	if err != nil {
		return st, wrap(err)
	}
	if err := s.inspectLeases(ctx, &st); err != nil {
		return st, wrap(err)
	}
	// A partitioned parent has no storage of its own: add its partitions
	// (pg_partition_tree lists none for a plain table).
	if err := s.pool.QueryRow(ctx, `SELECT (pg_total_relation_size($1::regclass) + COALESCE(
	(SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree($1::regclass) WHERE relid <> $1::regclass), 0))::bigint`,
		s.cfg.Table).Scan(&st.SizeBytes); err != nil {
		return st, wrap(err)
	}
	return st, nil
}

// inspectLeases adds the leases per consumer to st, none when the lease
// table is missing or not the role's (noLeases).
func (s *Store) inspectLeases(ctx context.Context, st *admin.TableStats) error {
	lt, err := s.cfg.LeaseTable()
	if err != nil {
		return nil // no lease table: no leases
	}
	rows, err := s.pool.Query(ctx, `SELECT consumer, count(*), count(*) FILTER (WHERE lease_until < $1) FROM `+lt+` GROUP BY consumer`, s.cfg.Now())
	if err == nil {
		var consumer string
		var n, expired int64
		_, err = pgx.ForEachRow(rows, []any{&consumer, &n, &expired}, func() error {
			sqlstore.AddLeases(st, consumer, n, expired)
			return nil
		})
	}
	if noLeases(err) {
		return nil
	}
	return err
}
