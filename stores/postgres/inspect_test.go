package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/storetest"
)

// TestInspect: rows, oldest and newest per consumer as claimed, a size on
// disk, for a plain and a partitioned table.
func TestInspect(t *testing.T) {
	for name, opts := range map[string][]postgres.Option{
		"plain":       nil,
		"partitioned": {postgres.WithPartitions(24 * time.Hour)},
	} {
		t.Run(name, func(t *testing.T) {
			pool := testPool(t)
			t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
			if name == "partitioned" {
				t0 = time.Now().UTC().Truncate(time.Second)
			}
			clock := storetest.NewClock(t0)
			s := openStore(t, pool, append(opts, postgres.WithClock(clock.Now))...)
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
