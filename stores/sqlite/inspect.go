package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemq/idemq/core/driver"
)

var _ driver.Inspector = (*Store)(nil)

// Inspect describes the dedup table for operators (idemq stats): claims
// and oldest/newest processed_at per consumer, and the bytes the table and
// its indexes take in the database file (from the dbstat table; 0 when the
// SQLite build lacks it).
func (s *Store) Inspect(ctx context.Context) (driver.TableStats, error) {
	st := driver.TableStats{Table: s.cfg.table}
	wrap := func(err error) error { return fmt.Errorf("sqlite: inspect %s: %w", s.cfg.table, err) }
	rows, err := s.db.QueryContext(ctx, `SELECT consumer, count(*), min(processed_at), max(processed_at)
FROM `+s.cfg.table+` GROUP BY consumer ORDER BY consumer`)
	if err != nil {
		return st, wrap(err)
	}
	defer rows.Close()
	for rows.Next() {
		var c driver.ConsumerStats
		var oldest, newest string
		if err := rows.Scan(&c.Consumer, &c.Rows, &oldest, &newest); err != nil {
			return st, wrap(err)
		}
		if c.Oldest, err = time.ParseInLocation(timeFormat, oldest, time.UTC); err != nil {
			return st, wrap(err)
		}
		if c.Newest, err = time.ParseInLocation(timeFormat, newest, time.UTC); err != nil {
			return st, wrap(err)
		}
		st.Consumers = append(st.Consumers, c)
		st.Rows += c.Rows
	}
	if err := rows.Err(); err != nil {
		return st, wrap(err)
	}
	var size sql.NullInt64
	// dbstat is an optional virtual table: without it the size is unknown
	// (0), which TableStats allows, rather than an error.
	if err := s.db.QueryRowContext(ctx, `SELECT sum(pgsize) FROM dbstat
WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = ?1)`, s.cfg.table).Scan(&size); err == nil {
		st.SizeBytes = size.Int64
	}
	return st, nil
}
