package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/postgres"
)

// ClaimOrBusy fails at once with ErrClaimBusy on an id another open
// transaction claimed, claims as Claim does otherwise, and leaves the
// transaction's later statements waiting for locks as usual, whether
// the claim begins the transaction or a statement did before it, on a
// plain and on a partitioned table.
func TestClaimOrBusy(t *testing.T) {
	pool := testPool(t)
	t.Run("plain", func(t *testing.T) { testClaimOrBusy(t, openStore(t, pool)) })
	t.Run("partitioned", func(t *testing.T) { testClaimOrBusy(t, openStore(t, pool, postgres.WithPartitions(24*time.Hour))) })
}

func testClaimOrBusy(t *testing.T, s *postgres.Store) {
	ctx := context.Background()
	begin := func() *postgres.Txn {
		txn, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { txn.Rollback(ctx) })
		return txn.(*postgres.Txn)
	}
	claim := func(txn *postgres.Txn, id string) (driver.ClaimResult, error) {
		res, err := txn.ClaimOrBusy(ctx, "busy", []driver.Claim{{ID: id, Fingerprint: "fp"}}, 50*time.Millisecond)
		if err != nil {
			return 0, err
		}
		return res[0], nil
	}
	lockTimeout := func(tx pgx.Tx) string {
		var v string
		if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}

	holder := begin()
	if res, err := claim(holder, "k"); err != nil || res != driver.ClaimWon {
		t.Fatalf("holder: %v %v, want won", res, err)
	}
	want := lockTimeout(holder.Tx())
	for _, started := range []bool{false, true} {
		copy := begin()
		if started {
			if _, err := copy.Tx().Exec(ctx, `SELECT 1`); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := claim(copy, "k"); !errors.Is(err, driver.ErrClaimBusy) {
			t.Fatalf("started %v: a copy of a claim in progress: %v, want ErrClaimBusy", started, err)
		}
		copy.Rollback(ctx)

		other := begin()
		if started {
			if _, err := other.Tx().Exec(ctx, `SELECT 1`); err != nil {
				t.Fatal(err)
			}
		}
		if res, err := claim(other, "other-"+map[bool]string{false: "a", true: "b"}[started]); err != nil || res != driver.ClaimWon {
			t.Fatalf("started %v: another id: %v %v, want won", started, res, err)
		}
		if got := lockTimeout(other.Tx()); got != want {
			t.Errorf("started %v: lock_timeout after the claim %q, want %q", started, got, want)
		}
		if err := other.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := claim(begin(), "k"); err != nil || res != driver.ClaimDuplicate {
		t.Fatalf("after the holder's commit: %v %v, want duplicate", res, err)
	}
}
