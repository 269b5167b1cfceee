package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemq/idemq/core/driver"
)

var _ driver.Inspector = (*Store)(nil)

// Inspect describes the dedup table for operators (idemq stats): claims
// and oldest/newest processed_at per consumer, and the table's data and
// index size as information_schema reports it (InnoDB's estimate, refreshed
// by ANALYZE TABLE). It counts every row, so on a very large table it takes
// as long as an index scan.
func (s *Store) Inspect(ctx context.Context) (driver.TableStats, error) {
	st := driver.TableStats{Table: s.cfg.table}
	wrap := func(err error) error { return fmt.Errorf("mysql: inspect %s: %w", s.cfg.table, err) }
	// processed_at is written as UTC text; read it back as text too, so
	// the driver's parseTime and loc settings do not matter.
	rows, err := s.db.QueryContext(ctx, `SELECT consumer, COUNT(*),
	DATE_FORMAT(MIN(processed_at), '%Y-%m-%d %H:%i:%s.%f'), DATE_FORMAT(MAX(processed_at), '%Y-%m-%d %H:%i:%s.%f')
FROM `+s.cfg.table+` GROUP BY consumer ORDER BY consumer`)
	if err != nil {
		return st, wrap(err)
	}
	defer rows.Close()
	for rows.Next() {
		var c driver.ConsumerStats
		var consumer []byte
		var oldest, newest string
		if err := rows.Scan(&consumer, &c.Rows, &oldest, &newest); err != nil {
			return st, wrap(err)
		}
		c.Consumer = string(consumer)
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
	err = s.db.QueryRowContext(ctx, `SELECT COALESCE(data_length, 0) + COALESCE(index_length, 0)
FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`, s.cfg.table).Scan(&size)
	if err != nil && err != sql.ErrNoRows {
		return st, wrap(err)
	}
	st.SizeBytes = size.Int64
	return st, nil
}
