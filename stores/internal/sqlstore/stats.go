package sqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// TimeFormat is how the database/sql stores write processed_at: fixed-width
// UTC text, so that text order is time order and the driver's time settings
// do not matter.
const TimeFormat = "2006-01-02 15:04:05.000000"

// FormatTime writes t in TimeFormat, in UTC.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }

// ConsumerStats runs query, which returns per consumer: the consumer, its
// claim count, and its oldest and newest processed_at as TimeFormat text.
// It returns the rows and the claims in all.
func ConsumerStats(ctx context.Context, db *sql.DB, query string) ([]driver.ConsumerStats, int64, error) {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var (
		out   []driver.ConsumerStats
		total int64
	)
	for rows.Next() {
		var c driver.ConsumerStats
		var consumer []byte // VARBINARY on MySQL; TEXT converts
		var oldest, newest string
		if err := rows.Scan(&consumer, &c.Rows, &oldest, &newest); err != nil {
			return nil, 0, err
		}
		c.Consumer = string(consumer)
		if c.Oldest, err = time.ParseInLocation(TimeFormat, oldest, time.UTC); err != nil {
			return nil, 0, err
		}
		if c.Newest, err = time.ParseInLocation(TimeFormat, newest, time.UTC); err != nil {
			return nil, 0, err
		}
		out = append(out, c)
		total += c.Rows
	}
	return out, total, rows.Err()
}

// ExecCount runs a statement on db and returns how many rows it changed.
func ExecCount(ctx context.Context, db *sql.DB, query string, args ...any) (int, error) {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}
