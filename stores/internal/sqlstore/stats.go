package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/admin"
)

// timeFormat is how the database/sql stores write processed_at: fixed-width
// UTC text, so that text order is time order and the driver's time settings
// do not matter.
const timeFormat = "2006-01-02 15:04:05.000000"

// formatTime writes t in timeFormat, in UTC.
func formatTime(t time.Time) string { return t.UTC().Format(timeFormat) }

// Row is the result of a query for one row: *sql.Row or pgx.Row.
type Row interface {
	Scan(dest ...any) error
}

// CountRows is a store's Estimate where the database tells no row
// statistics: it counts e.Table's rows up to admin.CountCap with the query
// it gives queryRow, and says so in e.RowsSource, followed by why.
func CountRows(e *admin.TableEstimate, why string, queryRow func(query string) Row) error {
	var n int64
	if err := queryRow(admin.BoundedCountSQL(e.Table, admin.CountCap)).Scan(&n); err != nil {
		return err
	}
	admin.CappedCount(e, n, admin.CountCap)
	e.RowsSource = admin.CountedUpTo(admin.CountCap) + why
	return nil
}

// Inspect describes the dedup table for operators (idemq stats): claims
// and oldest/newest processed_at per consumer, the claims in progress
// (leases, and how many of them expired), and the bytes the table and its
// indexes take (Dialect.SizeSQL). It counts every row, so on a very large
// table it takes as long as an index scan.
func (e *Engine) Inspect(ctx context.Context) (admin.TableStats, error) {
	st := admin.TableStats{Table: e.cfg.Table}
	var cs admin.ConsumerStats
	var consumer []byte // VARBINARY on MySQL; TEXT converts
	var oldest, newest string
	err := scanEach(ctx, e.db, `SELECT consumer, COUNT(*), `+e.timeText("MIN(processed_at)")+`, `+e.timeText("MAX(processed_at)")+
		` FROM `+e.cfg.Table+` GROUP BY consumer ORDER BY consumer`, nil, func() (err error) {
		cs.Consumer = string(consumer)
		if cs.Oldest, err = time.ParseInLocation(timeFormat, oldest, time.UTC); err != nil {
			return err
		}
		if cs.Newest, err = time.ParseInLocation(timeFormat, newest, time.UTC); err != nil {
			return err
		}
		st.Consumers = append(st.Consumers, cs)
		st.Rows += cs.Rows
		return nil
	}, &consumer, &cs.Rows, &oldest, &newest)
	if err != nil {
		return st, e.cfg.Wrap("inspect", err)
	}
	var size sql.NullInt64
	err = e.db.QueryRowContext(ctx, e.d.SizeSQL, e.cfg.Table).Scan(&size)
	if err != nil && !e.d.SizeOptional && !errors.Is(err, sql.ErrNoRows) {
		return st, e.cfg.Wrap("inspect", err)
	}
	st.SizeBytes = size.Int64
	return st, e.inspectLeases(ctx, &st)
}

// execCount runs a statement on db and returns how many rows it changed.
func execCount(ctx context.Context, db *sql.DB, query string, args ...any) (int, error) {
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

// inspectLeases adds the leases per consumer to st, none when the store
// has no lease table it may read.
func (e *Engine) inspectLeases(ctx context.Context, st *admin.TableStats) error {
	lt, err := e.cfg.LeaseTable()
	if err != nil {
		return nil // no lease table: no leases
	}
	var consumer []byte // VARBINARY on MySQL; TEXT converts
	var n, expired int64
	err = scanEach(ctx, e.db, `SELECT consumer, COUNT(*), SUM(CASE WHEN lease_until < ? THEN 1 ELSE 0 END) FROM `+lt+` GROUP BY consumer`,
		[]any{formatTime(e.cfg.Now())}, func() error { AddLeases(st, string(consumer), n, expired); return nil }, &consumer, &n, &expired)
	if err := e.skipNoLeases(err); err != nil {
		return e.cfg.Wrap("inspect", err)
	}
	return nil
}

// ClaimsPerMinuteSQL is the query of e's ClaimsPerMinute: the newest
// limit claims at or after its argument, read newest first on the
// processed_at index, counted by consumer and minute (the first 16
// characters of processed_at as timeFormat writes it). It is a function,
// not a method, so that the stores do not export it; their tests EXPLAIN
// it.
func ClaimsPerMinuteSQL(e *Engine, limit int) string {
	return `SELECT consumer, SUBSTR(` + e.timeText("processed_at") + `, 1, 16) AS minute, COUNT(*) FROM (SELECT consumer, processed_at FROM ` +
		e.cfg.Table + ` WHERE processed_at >= ? ORDER BY processed_at DESC LIMIT ` + strconv.Itoa(limit) + `) AS recent GROUP BY consumer, minute`
}

// ClaimsPerMinute counts the newest claims recorded at or after since, at
// most limit of them, by consumer and minute (admin.MinuteCounter). It
// reads at most limit entries of the processed_at index, and the rows
// they point to, whatever the table's size.
func (e *Engine) ClaimsPerMinute(ctx context.Context, since time.Time, limit int) ([]admin.MinuteClaims, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%s: ClaimsPerMinute: limit must be positive, got %d", e.cfg.Store, limit)
	}
	var out []admin.MinuteClaims
	var m admin.MinuteClaims
	var consumer []byte // VARBINARY on MySQL; TEXT converts
	var minute string
	err := scanEach(ctx, e.db, ClaimsPerMinuteSQL(e, limit), []any{formatTime(since)}, func() (err error) {
		m.Consumer = string(consumer)
		if m.Minute, err = time.ParseInLocation(timeFormat[:16], minute, time.UTC); err != nil {
			return err
		}
		out = append(out, m)
		return nil
	}, &consumer, &minute, &m.Claims)
	if err != nil {
		return nil, e.cfg.Wrap("count claims per minute", err)
	}
	return out, nil
}
