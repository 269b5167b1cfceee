package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/stores/postgres"
)

// TestEstimate: before the first ANALYZE the rows are counted (exactly,
// under the cap); after ANALYZE they come from pg_class.reltuples, near
// the rows inserted, for a plain and a partitioned table; the size is
// the table's with its indexes.
func TestEstimate(t *testing.T) {
	for name, opts := range map[string][]postgres.Option{
		"plain":       nil,
		"partitioned": {postgres.WithPartitions(24 * time.Hour)},
	} {
		t.Run(name, func(t *testing.T) {
			pool := testPool(t)
			s := openStore(t, pool, opts...)
			ctx := context.Background()
			insert := func(from, to int) {
				t.Helper()
				if _, err := pool.Exec(ctx, `INSERT INTO `+s.Table()+` (consumer, message_id, processed_at)
SELECT 'c' || (g % 3), 'id-' || g, now() FROM generate_series($1::int, $2::int) g`, from, to); err != nil {
					t.Fatal(err)
				}
			}
			insert(1, 7)
			e, err := s.Estimate(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if e.Table != s.Table() || e.Rows != 7 || !e.Counted || e.AtLeast || e.RowsText() != "7" ||
				!strings.Contains(e.RowsSource, "counted up to 10,000") || !strings.Contains(e.RowsSource, "unknown until the first ANALYZE") {
				t.Errorf("before ANALYZE: %+v, want 7 rows counted", e)
			}
			if e.SizeBytes <= 0 || e.SizeSource == "" {
				t.Errorf("before ANALYZE: size %d (%q), want > 0", e.SizeBytes, e.SizeSource)
			}

			insert(8, 2000)
			if _, err := pool.Exec(ctx, `ANALYZE `+s.Table()); err != nil {
				t.Fatal(err)
			}
			e, err = s.Estimate(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if e.Counted || e.AtLeast || e.Rows < 1000 || e.Rows > 4000 ||
				!strings.HasPrefix(e.RowsSource, "estimate from pg_class.reltuples") || e.StatsAt.IsZero() {
				t.Errorf("after ANALYZE: %+v, want about 2000 rows from pg_class.reltuples", e)
			}
			if !strings.HasPrefix(e.RowsText(), "about ") {
				t.Errorf("RowsText %q, want about …", e.RowsText())
			}
			st, err := s.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if e.SizeBytes != st.SizeBytes {
				t.Errorf("estimated size %d, Inspect's %d", e.SizeBytes, st.SizeBytes)
			}
		})
	}
}

// TestEstimateCapped: without statistics the count stops at
// admin.CountCap and says so.
func TestEstimateCapped(t *testing.T) {
	pool := testPool(t)
	s := openStore(t, pool)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO `+s.Table()+` (consumer, message_id)
SELECT 'c', 'id-' || g FROM generate_series(1, $1::int) g`, admin.CountCap+5); err != nil {
		t.Fatal(err)
	}
	e, err := s.Estimate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !e.Counted || !e.AtLeast || e.Rows != admin.CountCap || e.RowsText() != "10000+" {
		t.Errorf("%+v, want 10000+ counted", e)
	}
}
