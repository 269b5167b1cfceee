package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/internal/units"
)

// CountCap is where the bounded counts of Estimate stop: a table with
// more rows is reported as holding at least CountCap (TableEstimate.AtLeast).
const CountCap = 10000

// TableEstimate is what a store tells of its dedup table's size from
// bounded, cheap queries: the database's statistics, or a count that stops
// at CountCap. Neither reads the whole table, so it can be asked on every
// page view; the figures are approximate, and RowsSource and SizeSource
// say how each is obtained.
type TableEstimate struct {
	// Table is the dedup table's name.
	Table string
	// Rows is the approximate number of claims kept.
	Rows int64
	// Counted reports that Rows comes from a bounded count of the rows
	// (BoundedCountSQL), not from the database's statistics: it is exact
	// unless AtLeast is set.
	Counted bool
	// AtLeast reports that the bounded count stopped at its cap: the table
	// holds more than Rows claims.
	AtLeast bool
	// RowsSource says how Rows is obtained and when the database updates
	// it, for operators: "estimate from pg_class.reltuples, updated by
	// ANALYZE and autovacuum", "counted up to 10,000".
	RowsSource string
	// StatsAt is when the database last updated the statistics Rows comes
	// from (the least recent, over partitions); zero when Rows is counted
	// or the database does not tell.
	StatsAt time.Time
	// SizeBytes is the bytes the table takes on disk, as SizeSource says
	// (with its indexes, or the whole database file); 0 when the store
	// cannot tell.
	SizeBytes int64
	// SizeSource says how SizeBytes is obtained, for operators.
	SizeSource string
}

// RowsText is Rows for people: "about 1234" for a statistic, "1234" for
// a count, "10000+" for a count that reached its cap.
func (e TableEstimate) RowsText() string {
	switch {
	case e.AtLeast:
		return fmt.Sprintf("%d+", e.Rows)
	case e.Counted:
		return fmt.Sprint(e.Rows)
	default:
		return fmt.Sprintf("about %d", e.Rows)
	}
}

// Estimator is implemented by stores that can estimate their dedup
// table's size cheaply. Estimate runs only bounded queries (catalog and
// statistics look-ups, counts that stop at CountCap) and takes no locks
// that block claims.
type Estimator interface {
	Estimate(ctx context.Context) (TableEstimate, error)
}

// BoundedCountSQL is the SQL that counts table's rows up to limit+1: a
// result above limit means "more than limit". It reads at most limit+1
// rows (or index entries), however large the table.
func BoundedCountSQL(table string, limit int) string {
	return fmt.Sprintf("SELECT COUNT(*) FROM (SELECT 1 FROM %s LIMIT %d) AS bounded", table, limit+1)
}

// CappedCount turns the result n of BoundedCountSQL(…, limit) into
// e.Rows, e.Counted and e.AtLeast.
func CappedCount(e *TableEstimate, n int64, limit int) {
	e.Counted = true
	e.AtLeast = n > int64(limit)
	e.Rows = min(n, int64(limit))
}

// CountedUpTo is the RowsSource of a bounded count that stops at limit:
// "counted up to 10,000".
func CountedUpTo(limit int) string {
	return "counted up to " + thousands(int64(limit))
}

// thousands writes n with commas between groups of three digits.
func thousands(n int64) string { return units.Count(n) }

// Estimate estimates the dedup table's rows and size from bounded queries
// (Estimator), cheap enough to run on every page view, unlike Stats.
func (s *Store) Estimate(ctx context.Context) (TableEstimate, error) {
	return use(s, "estimate its table's size", func(es Estimator) (TableEstimate, error) { return es.Estimate(ctx) })
}
