package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/stores/sqlite"
	"github.com/idemq/idemq/stores/storetest"
)

// TestInspect: rows, oldest and newest per consumer as claimed, a size on
// disk.
func TestInspect(t *testing.T) {
	for name, opts := range map[string][]sqlite.Option{"plain": nil} {
		t.Run(name, func(t *testing.T) {
			t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
			clock := storetest.NewClock(t0)
			s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "in.db"), append(opts, sqlite.WithClock(clock.Now))...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			ctx := context.Background()

			empty, err := s.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if empty.Rows != 0 || len(empty.Consumers) != 0 || empty.Table != s.Table() {
				t.Fatalf("empty table: %+v", empty)
			}

			claim := func(consumer string, ids ...string) {
				txn, err := s.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var cs []driver.Claim
				for _, id := range ids {
					cs = append(cs, driver.Claim{ID: id})
				}
				if _, err := txn.Claim(ctx, consumer, cs); err != nil {
					t.Fatal(err)
				}
				if err := txn.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			claim("billing", "a", "b")
			clock.Set(t0.Add(time.Minute))
			claim("billing", "c")
			claim("audit", "a")

			st, err := s.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Rows != 4 || len(st.Consumers) != 2 {
				t.Fatalf("stats %+v, want 4 rows over 2 consumers", st)
			}
			audit, billing := st.Consumers[0], st.Consumers[1]
			if audit.Consumer != "audit" || audit.Rows != 1 || !audit.Oldest.Equal(t0.Add(time.Minute)) {
				t.Errorf("audit: %+v", audit)
			}
			if billing.Consumer != "billing" || billing.Rows != 3 || !billing.Oldest.Equal(t0) || !billing.Newest.Equal(t0.Add(time.Minute)) {
				t.Errorf("billing: %+v, want 3 rows from %v to %v", billing, t0, t0.Add(time.Minute))
			}
			if st.SizeBytes <= 0 {
				t.Errorf("SizeBytes %d, want > 0", st.SizeBytes)
			}
		})
	}
}
