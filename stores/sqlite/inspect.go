package sqlite

import (
	"context"

	"github.com/idemq/idemq/admin"
)

// Inspect describes the dedup table for operators (idemq stats): claims
// and oldest/newest processed_at per consumer, the claims in progress
// (leases, and how many of them expired), and the bytes the table and
// its indexes take in the database file (from the dbstat table; 0 when the
// SQLite build lacks it).
func (s *Store) Inspect(ctx context.Context) (admin.TableStats, error) {
	// dbstat is an optional virtual table: without it the size is unknown
	// (0), which TableStats allows, rather than an error.
	st, err := s.cfg.Inspect(ctx, s.db, `SELECT consumer, count(*), min(processed_at), max(processed_at)
FROM `+s.cfg.Table+` GROUP BY consumer ORDER BY consumer`, `SELECT sum(pgsize) FROM dbstat
WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = ?1)`, true)
	if err != nil {
		return st, err
	}
	return st, s.cfg.InspectLeases(ctx, s.claims(), &st)
}
