package mysql

import (
	"context"
	"database/sql"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

var _ driver.Inspector = (*Store)(nil)

// Inspect describes the dedup table for operators (idemq stats): claims
// and oldest/newest processed_at per consumer, and the table's data and
// index size as information_schema reports it (InnoDB's estimate, refreshed
// by ANALYZE TABLE). It counts every row, so on a very large table it takes
// as long as an index scan.
func (s *Store) Inspect(ctx context.Context) (driver.TableStats, error) {
	st := driver.TableStats{Table: s.cfg.Table}
	wrap := func(err error) error { return s.cfg.Wrap("inspect", err) }
	// processed_at is written as UTC text; read it back as text too, so
	// the driver's parseTime and loc settings do not matter.
	var err error
	st.Consumers, st.Rows, err = sqlstore.ConsumerStats(ctx, s.db, `SELECT consumer, COUNT(*),
	DATE_FORMAT(MIN(processed_at), '%Y-%m-%d %H:%i:%s.%f'), DATE_FORMAT(MAX(processed_at), '%Y-%m-%d %H:%i:%s.%f')
FROM `+s.cfg.Table+` GROUP BY consumer ORDER BY consumer`)
	if err != nil {
		return st, wrap(err)
	}
	var size sql.NullInt64
	err = s.db.QueryRowContext(ctx, `SELECT COALESCE(data_length, 0) + COALESCE(index_length, 0)
FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`, s.cfg.Table).Scan(&size)
	if err != nil && err != sql.ErrNoRows {
		return st, wrap(err)
	}
	st.SizeBytes = size.Int64
	return st, nil
}
