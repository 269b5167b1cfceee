package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/storetest"
)

// claimAt commits claims of ids recorded at the clock's time.
func claimAt(t *testing.T, s *postgres.Store, consumer string, ids ...string) {
	t.Helper()
	ctx := context.Background()
	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]driver.Claim, len(ids))
	for i, id := range ids {
		cs[i] = driver.Claim{ID: id}
	}
	if _, err := txn.Claim(ctx, consumer, cs); err != nil {
		t.Fatal(err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// pruneRound calls Prune with one cut until a batch comes back short and
// returns the batch sizes.
func pruneRound(t *testing.T, s *postgres.Store, before time.Time, limit int) []int {
	t.Helper()
	var got []int
	for range 100 {
		n, err := s.Prune(context.Background(), before, limit)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, n)
		if n < limit {
			return got
		}
	}
	t.Fatalf("prune did not finish: %v", got)
	return nil
}

// TestPruneResumesWhereItStopped: the calls of one round start where the
// last one stopped, yet rows that share the newest processed_at of a batch
// (a claim of many ids records one time) are all deleted, and rows a round
// passed over (locked by a live transaction, or recorded behind the
// position by a clock running late) go in the next round.
func TestPruneResumesWhereItStopped(t *testing.T) {
	pool := testPool(t)
	clock := storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s := openStore(t, pool, postgres.WithClock(clock.Now))
	ctx := context.Background()

	// Seven ids in one claim share a processed_at; batches of 3 split them.
	claimAt(t, s, "c", "t0", "t1", "t2", "t3", "t4", "t5", "t6")
	clock.Set(clock.Now().Add(time.Second))
	claimAt(t, s, "c", "a")
	clock.Set(clock.Now().Add(time.Second))
	claimAt(t, s, "c", "b")
	cut := clock.Now().Add(time.Minute)
	if got := fmt.Sprint(pruneRound(t, s, cut, 3)); got != "[3 3 3 0]" {
		t.Fatalf("batches of 3 over 9 rows: %s, want [3 3 3 0]", got)
	}

	// A row locked by a live transaction is skipped, and so is one
	// recorded behind the round's position after it moved past.
	clock.Set(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))
	claimAt(t, s, "c", "locked", "x1", "x2")
	clock.Set(clock.Now().Add(time.Second))
	claimAt(t, s, "c", "y1", "y2")
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT 1 FROM `+s.Table()+` WHERE message_id = 'locked' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	cut = clock.Now().Add(time.Minute)
	if n, err := s.Prune(ctx, cut, 2); err != nil || n != 2 {
		t.Fatalf("first batch: %d, %v; want 2", n, err)
	}
	clock.Set(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)) // behind the position
	claimAt(t, s, "c", "late")
	if got := fmt.Sprint(pruneRound(t, s, cut, 2)); got != "[2 0]" {
		t.Fatalf("rest of the round: %s, want [2 0]", got)
	}
	left := func() string {
		var ids string
		pool.QueryRow(ctx, `SELECT coalesce(string_agg(message_id, ',' ORDER BY message_id), '') FROM `+s.Table()).Scan(&ids)
		return ids
	}
	if got := left(); got != "late,locked" {
		t.Fatalf("after the round: %q left, want late,locked", got)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The next round (a later cut) starts from the oldest row again.
	if got := fmt.Sprint(pruneRound(t, s, cut.Add(time.Second), 10)); got != "[2]" {
		t.Fatalf("next round: %s, want [2]", got)
	}
	if got := left(); got != "" {
		t.Fatalf("after the next round: %q left, want none", got)
	}
}
