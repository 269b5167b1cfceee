package mysql

import (
	"context"

	"github.com/idemq/idemq/admin"
)

// Inspect describes the dedup table for operators (idemq stats): claims
// and oldest/newest processed_at per consumer, the claims in progress
// (leases, and how many of them expired), and the table's data and
// index size as information_schema reports it (InnoDB's estimate, refreshed
// by ANALYZE TABLE). It counts every row, so on a very large table it takes
// as long as an index scan.
func (s *Store) Inspect(ctx context.Context) (admin.TableStats, error) {
	// processed_at is written as UTC text; read it back as text too, so
	// the driver's parseTime and loc settings do not matter.
	st, err := s.cfg.Inspect(ctx, s.db, `SELECT consumer, COUNT(*),
	DATE_FORMAT(MIN(processed_at), '%Y-%m-%d %H:%i:%s.%f'), DATE_FORMAT(MAX(processed_at), '%Y-%m-%d %H:%i:%s.%f')
FROM `+s.cfg.Table+` GROUP BY consumer ORDER BY consumer`, `SELECT COALESCE(data_length, 0) + COALESCE(index_length, 0)
FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`, false)
	if err != nil {
		return st, err
	}
	return st, s.cfg.InspectLeases(ctx, s.claims(), &st)
}
