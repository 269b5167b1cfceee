package sqlite

import (
	"context"
	"database/sql"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

var _ driver.Inspector = (*Store)(nil)

// Inspect describes the dedup table for operators (idemq stats): claims
// and oldest/newest processed_at per consumer, and the bytes the table and
// its indexes take in the database file (from the dbstat table; 0 when the
// SQLite build lacks it).
func (s *Store) Inspect(ctx context.Context) (driver.TableStats, error) {
	st := driver.TableStats{Table: s.cfg.Table}
	var err error
	st.Consumers, st.Rows, err = sqlstore.ConsumerStats(ctx, s.db, `SELECT consumer, count(*), min(processed_at), max(processed_at)
FROM `+s.cfg.Table+` GROUP BY consumer ORDER BY consumer`)
	if err != nil {
		return st, s.cfg.Wrap("inspect", err)
	}
	var size sql.NullInt64
	// dbstat is an optional virtual table: without it the size is unknown
	// (0), which TableStats allows, rather than an error.
	if err := s.db.QueryRowContext(ctx, `SELECT sum(pgsize) FROM dbstat
WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = ?1)`, s.cfg.Table).Scan(&size); err == nil {
		st.SizeBytes = size.Int64
	}
	return st, nil
}
