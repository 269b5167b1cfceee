package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestFailoverErrorsAreTransient goes through a failover of a private
// synchronous pair with a store opened by the pair's multi-host URL, and
// checks that every error it meets on the way is transient (a permanent
// one would dead-letter the message): a claim on the standby (25006,
// which also drops the read-only connection), a commit on a connection
// the server terminated (57P01), a claim while the primary is down and
// the standby not yet promoted (no server takes writes), a claim on a
// connection the crashed primary cut. After the promotion the same store
// claims on the new primary, which has the old primary's claims.
func TestFailoverErrorsAreTransient(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two private PostgreSQL servers; not in -short")
	}
	pair := servicetest.StartPostgresPair(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Through core.OpenStore, as a deployment's URL is read: the
	// multi-host form and target_session_attrs pass to pgx.
	st, err := core.OpenStore[pgx.Tx](ctx, pair.URL+"&table=failover_claims")
	if err != nil {
		t.Fatal(err)
	}
	defer st.(interface{ Close() error }).Close()
	claim := func(s driver.Store[pgx.Tx], id string) (driver.Txn[pgx.Tx], driver.ClaimResult, error) {
		t.Helper()
		txn, err := s.Begin(ctx)
		if err != nil {
			return nil, 0, err
		}
		res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: id}})
		if err != nil {
			txn.Rollback(ctx)
			return nil, 0, err
		}
		return txn, res[0], nil
	}
	mustTransient := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		if !postgres.IsTransient(err) {
			t.Fatalf("%s: %v is not transient", what, err)
		}
		t.Logf("%s (transient): %v", what, err)
	}
	txn, res, err := claim(st, "a")
	if err != nil || res != driver.ClaimWon {
		t.Fatalf("claim on the primary: %v %v", res, err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// The standby refuses writes: 25006, and the connection goes.
	spool, err := pgxpool.New(ctx, pair.Standby.URL+"?pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	defer spool.Close()
	standby, err := postgres.New(spool, postgres.WithTable("failover_claims"))
	if err != nil {
		t.Fatal(err)
	}
	backend := func() int32 {
		t.Helper()
		var pid int32
		if err := spool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	before := backend()
	_, _, err = claim(standby, "b")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "25006" {
		t.Fatalf("claim on the standby: %v; want SQLSTATE 25006", err)
	}
	mustTransient("claim on the standby", err)
	if after := backend(); after == before {
		t.Errorf("the read-only connection (backend %d) is still in the pool after a 25006", before)
	}

	// A connection the server terminates: 57P01 at the commit.
	txn, res, err = claim(st, "b")
	if err != nil || res != driver.ClaimWon {
		t.Fatalf("claim b: %v %v", res, err)
	}
	var pid int32
	if err := txn.Tx().QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, pair.Primary.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	mustTransient("commit on a terminated connection", txn.Commit(ctx))
	txn.Rollback(ctx)

	// A claim whose connection the primary's crash cuts.
	txn, res, err = claim(st, "b")
	if err != nil || res != driver.ClaimWon {
		t.Fatalf("claim b again: %v %v", res, err)
	}
	pair.StopPrimary()
	mustTransient("commit on the crashed primary", txn.Commit(ctx))
	txn.Rollback(ctx)

	// Neither server takes writes: the pool cannot connect.
	_, _, err = claim(st, "b")
	mustTransient("claim with the primary down and the standby not promoted", err)

	pair.Promote()
	// The pool may hold no connection, or one the promotion kept: either
	// way the next claims go to the new primary, which has every commit
	// the old one acknowledged.
	var got driver.ClaimResult
	servicetest.WaitFor(t, 30*time.Second, "a claim on the new primary", func() bool {
		txn, got, err = claim(st, "a")
		if err != nil {
			mustTransient("claim during the promotion", err)
			return false
		}
		txn.Rollback(ctx)
		return true
	})
	if got != driver.ClaimDuplicate {
		t.Fatalf("claim a on the new primary: %v; want duplicate (a commit acknowledged before the failover must survive it)", got)
	}
	txn, res, err = claim(st, "b")
	if err != nil || res != driver.ClaimWon {
		t.Fatalf("claim b on the new primary: %v %v; want won (no commit of b was acknowledged)", res, err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
