package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/idemq/idemq/admin"
)

// TimeFormat is how the database/sql stores write processed_at: fixed-width
// UTC text, so that text order is time order and the driver's time settings
// do not matter.
const TimeFormat = "2006-01-02 15:04:05.000000"

// FormatTime writes t in TimeFormat, in UTC.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }

// Inspect is a database/sql store's Inspect. statsSQL returns per
// consumer: the consumer, its claim count, and its oldest and newest
// processed_at as TimeFormat text. sizeSQL takes the table's name and
// returns the bytes it takes; when sizeOptional is set a failing sizeSQL
// leaves the size unknown (0) instead of failing.
func (c *Config) Inspect(ctx context.Context, db *sql.DB, statsSQL, sizeSQL string, sizeOptional bool) (admin.TableStats, error) {
	st := admin.TableStats{Table: c.Table}
	rows, err := db.QueryContext(ctx, statsSQL)
	if err != nil {
		return st, c.Wrap("inspect", err)
	}
	defer rows.Close()
	for rows.Next() {
		var cs admin.ConsumerStats
		var consumer []byte // VARBINARY on MySQL; TEXT converts
		var oldest, newest string
		if err := rows.Scan(&consumer, &cs.Rows, &oldest, &newest); err != nil {
			return st, c.Wrap("inspect", err)
		}
		cs.Consumer = string(consumer)
		if cs.Oldest, err = time.ParseInLocation(TimeFormat, oldest, time.UTC); err != nil {
			return st, c.Wrap("inspect", err)
		}
		if cs.Newest, err = time.ParseInLocation(TimeFormat, newest, time.UTC); err != nil {
			return st, c.Wrap("inspect", err)
		}
		st.Consumers = append(st.Consumers, cs)
		st.Rows += cs.Rows
	}
	if err := rows.Err(); err != nil {
		return st, c.Wrap("inspect", err)
	}
	var size sql.NullInt64
	err = db.QueryRowContext(ctx, sizeSQL, c.Table).Scan(&size)
	if err != nil && !sizeOptional && !errors.Is(err, sql.ErrNoRows) {
		return st, c.Wrap("inspect", err)
	}
	st.SizeBytes = size.Int64
	return st, nil
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

// AddLeases adds n leases of consumer to st, expired of them run out. A
// consumer with leases but no claims is added, and the consumers sorted
// by name again.
func AddLeases(st *admin.TableStats, consumer string, n, expired int64) {
	i := slices.IndexFunc(st.Consumers, func(c admin.ConsumerStats) bool { return c.Consumer == consumer })
	if i < 0 {
		st.Consumers = append(st.Consumers, admin.ConsumerStats{Consumer: consumer, Leases: n, ExpiredLeases: expired})
		slices.SortStableFunc(st.Consumers, func(a, b admin.ConsumerStats) int { return strings.Compare(a.Consumer, b.Consumer) })
		return
	}
	st.Consumers[i].Leases += n
	st.Consumers[i].ExpiredLeases += expired
}

// InspectLeases adds the leases per consumer to st, none when the store
// has no lease table it may read.
func (c *Config) InspectLeases(ctx context.Context, cl Claims, st *admin.TableStats) error {
	lt, err := c.LeaseTable()
	if err != nil {
		return nil // no lease table: no leases
	}
	rows, err := cl.DB.QueryContext(ctx, `SELECT consumer, COUNT(*), SUM(CASE WHEN lease_until < ? THEN 1 ELSE 0 END) FROM `+lt+` GROUP BY consumer`,
		FormatTime(c.Now()))
	if err != nil {
		return cl.SkipNoLeases(err)
	}
	defer rows.Close()
	for rows.Next() {
		var consumer []byte // VARBINARY on MySQL; TEXT converts
		var n, expired int64
		if err := rows.Scan(&consumer, &n, &expired); err != nil {
			return c.Wrap("inspect", err)
		}
		AddLeases(st, string(consumer), n, expired)
	}
	if err := rows.Err(); err != nil {
		return c.Wrap("inspect", err)
	}
	return nil
}
