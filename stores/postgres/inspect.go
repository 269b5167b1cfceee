package postgres

import (
	"context"
	"fmt"
	"time"

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
	if err := s.pool.QueryRow(ctx, sizeSQL, s.cfg.Table).Scan(&st.SizeBytes); err != nil {
		return st, wrap(err)
	}
	return st, nil
}

// sizeSQL returns the bytes the table named by $1 takes with its indexes.
// A partitioned parent has no storage of its own: its partitions are
// added (pg_partition_tree lists none for a plain table). It reads the
// files' sizes, not their contents.
const sizeSQL = `SELECT (pg_total_relation_size($1::regclass) + COALESCE(
	(SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree($1::regclass) WHERE relid <> $1::regclass), 0))::bigint`

// estimateSQL sums pg_class.reltuples over the table named by $1, or over
// its partitions for a partitioned parent: how many of them there are, how
// many have statistics (reltuples is -1 until the first ANALYZE or
// VACUUM), their rows, and when the least recent of those statistics
// was taken.
const estimateSQL = `SELECT count(*), count(*) FILTER (WHERE reltuples >= 0),
	COALESCE(sum(reltuples) FILTER (WHERE reltuples >= 0), 0)::bigint, min(at) FILTER (WHERE reltuples >= 0)
FROM (SELECT c.reltuples, GREATEST(pg_stat_get_last_analyze_time(c.oid), pg_stat_get_last_autoanalyze_time(c.oid),
		pg_stat_get_last_vacuum_time(c.oid), pg_stat_get_last_autovacuum_time(c.oid)) AS at
	FROM pg_class c
	WHERE c.relkind <> 'p' AND c.oid IN (SELECT $1::regclass UNION ALL SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf)) AS parts`

// Estimate estimates the dedup table's rows and size (admin.Estimator)
// from the catalog: pg_class.reltuples, which ANALYZE, VACUUM and
// autovacuum update, summed over the partitions of a table made
// WithPartitions; and pg_total_relation_size with the indexes, as Inspect
// reports it. Before the table's first ANALYZE or VACUUM reltuples is
// unknown, and Estimate counts the rows instead, up to admin.CountCap.
// Every query is bounded whatever the table's size.
func (s *Store) Estimate(ctx context.Context) (admin.TableEstimate, error) {
	e := admin.TableEstimate{Table: s.cfg.Table,
		SizeSource: "pg_total_relation_size, with indexes"}
	wrap := func(err error) error { return s.cfg.Wrap("estimate", err) }
	var parts, known int
	var at *time.Time
	if err := s.pool.QueryRow(ctx, estimateSQL, s.cfg.Table).Scan(&parts, &known, &e.Rows, &at); err != nil {
		return e, wrap(err)
	}
	switch {
	case known == 0:
		if err := sqlstore.CountRows(&e, " (pg_class.reltuples is unknown until the first ANALYZE)", func(q string) sqlstore.Row { return s.pool.QueryRow(ctx, q) }); err != nil {
			return e, wrap(err)
		}
	default:
		e.RowsSource = "estimate from pg_class.reltuples, updated by ANALYZE and autovacuum"
		if at != nil {
			e.StatsAt = *at
		}
		if known < parts {
			e.RowsSource += fmt.Sprintf("; %d of %d partitions not analyzed yet, counted as empty", parts-known, parts)
		}
	}
	if err := s.pool.QueryRow(ctx, sizeSQL, s.cfg.Table).Scan(&e.SizeBytes); err != nil {
		return e, wrap(err)
	}
	return e, nil
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

// claimsPerMinuteSQL is the query of ClaimsPerMinute: the newest $2
// claims at or after $1, read newest first on the processed_at index,
// counted by consumer and minute.
const claimsPerMinuteSQL = `SELECT consumer, date_trunc('minute', processed_at) AS minute, count(*)
FROM (SELECT consumer, processed_at FROM %s WHERE processed_at >= $1 ORDER BY processed_at DESC LIMIT $2) AS recent
GROUP BY consumer, minute`

var _ admin.MinuteCounter = (*Store)(nil)

// ClaimsPerMinute counts the newest claims recorded at or after since, at
// most limit of them, by consumer and minute (admin.MinuteCounter). It
// reads at most limit entries of the processed_at index (of each
// partition, for a table made WithPartitions), and the rows they point
// to, whatever the table's size.
func (s *Store) ClaimsPerMinute(ctx context.Context, since time.Time, limit int) ([]admin.MinuteClaims, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("postgres: ClaimsPerMinute: limit must be positive, got %d", limit)
	}
	rows, err := s.pool.Query(ctx, fmt.Sprintf(claimsPerMinuteSQL, s.cfg.Table), since, limit)
	if err != nil {
		return nil, s.cfg.Wrap("count claims per minute", err)
	}
	var out []admin.MinuteClaims
	var m admin.MinuteClaims
	_, err = pgx.ForEachRow(rows, []any{&m.Consumer, &m.Minute, &m.Claims}, func() error {
		out = append(out, m)
		return nil
	})
	if err != nil {
		return nil, s.cfg.Wrap("count claims per minute", err)
	}
	return out, nil
}
