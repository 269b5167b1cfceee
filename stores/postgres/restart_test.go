package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestServerRestartBetweenClaimAndCommit restarts the server after a
// transaction claimed an id and applied its effect: the commit fails with
// a transient error, neither the claim nor the effect survives, and the
// redelivery after the restart applies the effect once.
func TestServerRestartBetweenClaimAndCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL server; not in -short")
	}
	srv := servicetest.StartPostgres(t)
	url, restart := srv.URL, srv.Restart
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (k TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	s, err := postgres.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	process := func() (driver.ClaimResult, driver.Txn[pgx.Tx], error) {
		txn, err := s.Begin(ctx)
		if err != nil {
			return 0, nil, err
		}
		res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "m"}})
		if err != nil {
			return 0, txn, err
		}
		if res[0] == driver.ClaimWon {
			_, err = txn.Tx().Exec(ctx, `INSERT INTO effects VALUES ('m')`)
		}
		return res[0], txn, err
	}
	res, txn, err := process()
	if err != nil || res != driver.ClaimWon {
		t.Fatalf("first delivery: %v %v", res, err)
	}
	restart()
	err = txn.Commit(ctx)
	if err == nil {
		t.Fatal("commit across a server restart succeeded")
	}
	if !postgres.IsTransient(err) {
		t.Fatalf("commit error after restart is not transient: %v", err)
	}
	t.Logf("commit after restart (transient): %v", err)
	if err := txn.Rollback(ctx); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	// The redelivery: the pool reconnects, the claim is free again.
	res, txn, err = process()
	if err != nil || res != driver.ClaimWon {
		t.Fatalf("redelivery after restart: %v %v; want won", res, err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res, txn, err = process()
	if err != nil || res != driver.ClaimDuplicate {
		t.Fatalf("third delivery: %v %v; want duplicate", res, err)
	}
	txn.Rollback(ctx)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("effects: %d, %v; want 1", n, err)
	}
}
