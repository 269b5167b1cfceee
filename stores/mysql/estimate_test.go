package mysql_test

import (
	"context"
	"strings"
	"testing"
)

// TestEstimate: after inserts and ANALYZE TABLE the rows are InnoDB's
// estimate, near the rows inserted, and the size is Inspect's.
func TestEstimate(t *testing.T) {
	db := testDB(t)
	s := openStore(t, db)
	ctx := context.Background()
	// 2000 rows in one statement: a recursive CTE (MariaDB 10.2+, MySQL 8)
	// of 1000, which MariaDB's max_recursive_iterations allows, twice.
	if _, err := db.ExecContext(ctx, `INSERT INTO `+s.Table()+` (consumer, message_id, processed_at)
WITH RECURSIVE g (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 1000)
SELECT CONCAT('c', n % 3), CONCAT('id-', n + 1000 * k), UTC_TIMESTAMP(6) FROM g, (SELECT 0 AS k UNION ALL SELECT 1) AS twice`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `ANALYZE TABLE `+s.Table()); err != nil {
		t.Fatal(err)
	}
	e, err := s.Estimate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if e.Table != s.Table() || e.Counted || e.AtLeast || e.Rows < 1000 || e.Rows > 4000 ||
		!strings.HasPrefix(e.RowsSource, "InnoDB estimate") || !strings.HasPrefix(e.RowsText(), "about ") {
		t.Errorf("%+v, want about 2000 rows, an InnoDB estimate", e)
	}
	st, err := s.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if e.SizeBytes <= 0 || e.SizeBytes != st.SizeBytes || e.SizeSource == "" {
		t.Errorf("estimated size %d (%q), Inspect's %d", e.SizeBytes, e.SizeSource, st.SizeBytes)
	}
}
