package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/storetest"
	"github.com/jackc/pgx/v5"
)

// TestPartitionedConformance runs the whole suite on a table partitioned by
// hour: the advisory locks must give the same guarantees as the primary
// key of the plain table.
func TestPartitionedConformance(t *testing.T) {
	pool := testPool(t)
	fx := effectsTable(t, pool)
	storetest.Run(t, storetest.Harness[pgx.Tx]{
		Open: func(t *testing.T, cfg storetest.Config) (driver.Store[pgx.Tx], error) {
			s, err := postgres.New(pool, postgres.WithTable(cfg.Table), postgres.WithClock(cfg.Now), postgres.WithPartitions(time.Hour))
			if err != nil {
				return nil, err
			}
			// Cleanup before Migrate: a failed Migrate may have made the table.
			t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+cfg.Table+`, `+cfg.Table+`_leases`) })
			if err := s.Migrate(context.Background()); err != nil {
				return nil, err
			}
			return s, nil
		},
		Leaser:         true,
		DropLeaseTable: func(t *testing.T, table string) { dropLeaseTable(t, pool, table) },
		Effect: func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+fx+` (k) VALUES ($1)`, key)
			return err
		},
		Fail: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT 1/0`)
			return err
		},
		CountEffects: func(t *testing.T, key string) int {
			var n int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+fx+` WHERE k = $1`, key).Scan(&n); err != nil {
				t.Fatalf("count effects: %v", err)
			}
			return n
		},
		Retryable: postgres.IsTransient,
	})
}

// TestDropPartitions claims ids in three hourly partitions, then drops by
// time: only partitions that ended before the cut go, with their claims;
// RunPruner does the same from the retention.
func TestDropPartitions(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	clock := storetest.NewClock(t0.Add(10 * time.Minute))
	s := openStore(t, pool, postgres.WithClock(clock.Now), postgres.WithPartitions(time.Hour), postgres.WithRetention(time.Hour))
	claimAt := func(at time.Time, id string) driver.ClaimResult {
		t.Helper()
		clock.Set(at)
		txn, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer txn.Rollback(ctx)
		res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: id}})
		if err != nil {
			t.Fatal(err)
		}
		if err := txn.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	claimAt(t0.Add(10*time.Minute), "a")
	claimAt(t0.Add(70*time.Minute), "b")
	claimAt(t0.Add(130*time.Minute), "c")
	parts, err := s.Partitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 5 || !parts[0].Start.Equal(t0) || !parts[4].End.Equal(t0.Add(5*time.Hour)) {
		t.Fatalf("partitions %+v; want 5 hourly from %v", parts, t0)
	}
	for _, p := range parts {
		if !strings.HasPrefix(p.Name, s.Table()+"_p") {
			t.Fatalf("partition name %q", p.Name)
		}
	}
	if n, err := s.DropPartitions(ctx, t0.Add(90*time.Minute)); err != nil || n != 1 {
		t.Fatalf("DropPartitions before %v: %d, %v; want 1", t0.Add(90*time.Minute), n, err)
	}
	// "a" was in the dropped partition: claimable again; "b" straddles the
	// cut and is kept.
	if r := claimAt(t0.Add(140*time.Minute), "a"); r != driver.ClaimWon {
		t.Fatalf("a after drop: %v, want won", r)
	}
	if r := claimAt(t0.Add(140*time.Minute), "b"); r != driver.ClaimDuplicate {
		t.Fatalf("b after drop: %v, want duplicate", r)
	}

	// A lease that expired before the cut goes with the partitions; a live
	// one stays.
	acquireAt := func(at time.Time, id string) {
		t.Helper()
		clock.Set(at)
		if l, err := s.Acquire(ctx, "c", driver.Claim{ID: id}, time.Hour); err != nil || l.Result != driver.LeaseWon {
			t.Fatalf("acquire %s: %+v, %v", id, l, err)
		}
	}
	acquireAt(t0, "expired")
	acquireAt(t0.Add(5*time.Hour+30*time.Minute), "live")
	leases := func() string {
		var ids string
		pool.QueryRow(ctx, `SELECT coalesce(string_agg(message_id, ','), '') FROM `+s.Table()+`_leases`).Scan(&ids)
		return ids
	}

	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.RunPruner(pctx, time.Hour, 100, nil) }()
	// The first round runs at once; wait for it to show.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		parts, err = s.Partitions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(parts) > 0 && parts[0].Start.Equal(t0.Add(4*time.Hour)) && leases() == "live" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	// Cut at 4:30 past t0: partitions ending by then are gone; the one
	// holding the cut, the current one (5h) and two ahead remain.
	if len(parts) != 4 || !parts[0].Start.Equal(t0.Add(4*time.Hour)) || !parts[3].End.Equal(t0.Add(8*time.Hour)) {
		t.Fatalf("partitions after RunPruner: %+v", parts)
	}
	if got := leases(); got != "live" {
		t.Fatalf("leases after RunPruner: %q, want only live", got)
	}
	if r := claimAt(clock.Now(), "c"); r != driver.ClaimWon {
		t.Fatalf("c after its partition was dropped: %v, want won", r)
	}
}

// TestPartitionModeMismatch: a store refuses a table made in the other
// mode instead of losing the unique key or the partition drops.
func TestPartitionModeMismatch(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	plain := openStore(t, pool)
	s, err := postgres.New(pool, postgres.WithTable(plain.Table()), postgres.WithPartitions(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err == nil {
		t.Fatal("partitioned Migrate accepted a plain table")
	}
	part := openStore(t, pool, postgres.WithPartitions(24*time.Hour))
	s, err = postgres.New(pool, postgres.WithTable(part.Table()))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err == nil {
		t.Fatal("plain Migrate accepted a partitioned table")
	}
	if _, err := postgres.New(pool, postgres.WithPartitions(90*time.Second)); err == nil || !strings.Contains(err.Error(), "WithPartitions") {
		t.Fatalf("period of 90s: %v", err)
	}
}
