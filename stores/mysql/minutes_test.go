package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/stores/internal/sqlstore"
	"github.com/idemq/idemq/stores/storetest"
)

// TestClaimsPerMinute: the claims of the last hour are counted by
// consumer and minute, on a range of the processed_at index read newest
// first that stops at the limit (EXPLAIN: a range read of the index, no
// filesort; on MariaDB, ANALYZE: no more rows read than the limit).
func TestClaimsPerMinute(t *testing.T) {
	db := testDB(t)
	s := openStore(t, db)
	ctx := context.Background()
	r := storetest.MinuteRows{N: 20000, Newest: time.Date(2026, 11, 29, 10, 0, 30, 0, time.UTC), Step: 360 * time.Millisecond}
	// 20 × 1000 rows: a recursive CTE of 1000, which MariaDB's
	// max_recursive_iterations allows, times 20.
	if _, err := db.ExecContext(ctx, `INSERT INTO `+s.Table()+` (consumer, message_id, processed_at)
WITH RECURSIVE g (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n < 999),
k (m) AS (SELECT 0 UNION ALL SELECT m + 1 FROM k WHERE m < 19)
SELECT CONCAT('c', (n + 1000 * m) % 2), CONCAT('id-', n + 1000 * m), TIMESTAMP(?) - INTERVAL ((n + 1000 * m) * ?) MICROSECOND FROM g, k`,
		r.Newest.Format("2006-01-02 15:04:05"), r.Step.Microseconds()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `ANALYZE TABLE `+s.Table()); err != nil {
		t.Fatal(err)
	}
	storetest.CheckClaimsPerMinute(t, s, r)

	const limit = 500
	query := sqlstore.ClaimsPerMinuteSQL(s.Engine, limit)
	since := "2026-11-29 09:01:00.000000"
	plan := explain(t, db, "EXPLAIN "+query, since)
	t.Logf("plan:\n%s", plan)
	var index bool
	for _, row := range plan {
		if row["table"] == s.Table() {
			index = row["key"] == "idemq_processed_at" && row["type"] == "range" && !strings.Contains(row["Extra"], "filesort")
		}
	}
	if !index {
		t.Errorf("the plan does not read a range of the processed_at index without a sort:\n%v", plan)
	}
	var version string
	if err := db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(version, "MariaDB") {
		return
	}
	// MariaDB's ANALYZE runs the query and reports the rows each step
	// read (r_rows).
	analyzed := explain(t, db, "ANALYZE "+query, since)
	t.Logf("analyzed:\n%v", analyzed)
	read := false
	for _, row := range analyzed {
		if row["table"] != s.Table() {
			continue
		}
		read = true
		var n float64
		if _, err := fmt.Sscan(row["r_rows"], &n); err != nil || n > limit {
			t.Errorf("the processed_at index: %s rows read (%v), want at most %d:\n%v", row["r_rows"], err, limit, row)
		}
	}
	if !read {
		t.Errorf("ANALYZE shows no read of %s:\n%v", s.Table(), analyzed)
	}
}

// explain runs an EXPLAIN or ANALYZE statement and returns its rows, each
// by column name.
func explain(t *testing.T, db *sql.DB, query string, args ...any) []map[string]string {
	t.Helper()
	rows, err := db.Query(query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
