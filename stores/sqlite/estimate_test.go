package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/stores/sqlite"
)

// TestEstimate: the rows are counted, exactly under admin.CountCap and
// as "10000+" past it; the size is the database file's.
func TestEstimate(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "est.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var db *sql.DB
	if !s.As(&db) {
		t.Fatal("no *sql.DB")
	}
	insert := func(from, to int) {
		t.Helper()
		if _, err := db.ExecContext(ctx, `INSERT INTO `+s.Table()+` (consumer, message_id, processed_at)
WITH RECURSIVE g (n) AS (SELECT ?1 UNION ALL SELECT n + 1 FROM g WHERE n < ?2)
SELECT 'c' || (n % 3), 'id-' || n, '2026-11-29 10:00:00.000000' FROM g`, from, to); err != nil {
			t.Fatal(err)
		}
	}

	e, err := s.Estimate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if e.Table != s.Table() || e.Rows != 0 || !e.Counted || e.AtLeast || e.RowsSource != "counted up to 10,000" {
		t.Errorf("empty: %+v", e)
	}
	insert(1, admin.CountCap)
	e, err = s.Estimate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if e.Rows != admin.CountCap || !e.Counted || e.AtLeast || e.RowsText() != "10000" {
		t.Errorf("at the cap: %+v, want exactly 10000", e)
	}
	insert(admin.CountCap+1, admin.CountCap+1)
	e, err = s.Estimate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if e.Rows != admin.CountCap || !e.Counted || !e.AtLeast || e.RowsText() != "10000+" {
		t.Errorf("past the cap: %+v, want 10000+", e)
	}
	if e.SizeBytes < 100_000 || e.SizeSource == "" {
		t.Errorf("size %d (%q), want the file's, > 100 kB for 10001 rows", e.SizeBytes, e.SizeSource)
	}
}
