package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/stores/internal/sqlstore"
	"github.com/idemq/idemq/stores/sqlite"
	"github.com/idemq/idemq/stores/storetest"
)

// TestClaimsPerMinute: the claims of the last hour are counted by
// consumer and minute, on a range of the processed_at index read newest
// first that stops at the limit (EXPLAIN QUERY PLAN: a search of the
// index, no scan of the table, no sort before the limit).
func TestClaimsPerMinute(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "minutes.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var db *sql.DB
	if !s.As(&db) {
		t.Fatal("no *sql.DB")
	}
	r := storetest.MinuteRows{N: 20000, Newest: time.Date(2026, 11, 29, 10, 0, 30, 0, time.UTC), Step: 360 * time.Millisecond}
	if _, err := db.ExecContext(ctx, `INSERT INTO `+s.Table()+` (consumer, message_id, processed_at)
WITH RECURSIVE g (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n < ?1 - 1)
SELECT 'c' || (n % 2), 'id-' || n, strftime('%Y-%m-%d %H:%M:%f', ?2, '-' || (n * ?3 / 1000.0) || ' seconds') || '000' FROM g`,
		r.N, r.Newest.Format("2006-01-02 15:04:05"), r.Step.Milliseconds()); err != nil {
		t.Fatal(err)
	}
	var oldest, newest string
	if err := db.QueryRowContext(ctx, `SELECT MIN(processed_at), MAX(processed_at) FROM `+s.Table()).Scan(&oldest, &newest); err != nil {
		t.Fatal(err)
	}
	if oldest != r.At(r.N-1).Format("2006-01-02 15:04:05.000000") || newest != r.At(0).Format("2006-01-02 15:04:05.000000") {
		t.Fatalf("rows from %s to %s, want from %v to %v", oldest, newest, r.At(r.N-1), r.At(0))
	}
	storetest.CheckClaimsPerMinute(t, s, r)

	rows, err := db.QueryContext(ctx, `EXPLAIN QUERY PLAN `+sqlstore.ClaimsPerMinuteSQL(s.Engine, 500), "2026-11-29 09:01:00.000000")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	t.Logf("plan:\n%s", text)
	if !strings.Contains(text, "SEARCH "+s.Table()+" USING INDEX "+s.Table()+"_processed_at_idx (processed_at>?)") ||
		strings.Contains(text, "SCAN "+s.Table()) || strings.Contains(text, "FOR ORDER BY") {
		t.Errorf("the plan does not read a bounded range of the processed_at index newest first:\n%s", text)
	}
}
