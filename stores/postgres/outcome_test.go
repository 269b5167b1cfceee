package postgres_test

import (
	"context"
	"net"
	"strconv"
	"testing"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestCommitOutcomeLost sends a commit whose answer never comes back (the
// connection is cut once COMMIT is on its way, as a network failure or a
// failover does): the commit lands on the server, the caller gets a
// transient error, so the Consumer retries, and the redelivery's claim is
// a duplicate: the effect stays applied once.
func TestCommitOutcomeLost(t *testing.T) {
	direct := testPool(t)
	cfg, err := pgxpool.ParseConfig(postgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := servicetest.StartProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(proxy.Addr)
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	for _, fb := range cfg.ConnConfig.Fallbacks {
		fb.Host, fb.Port = host, uint16(p)
	}
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // after openStore's cleanup, which drops the tables through it
	s := openStore(t, pool)
	fx := effectsTable(t, direct)

	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "m"}}); err != nil || res[0] != driver.ClaimWon {
		t.Fatalf("claim: %v %v", res, err)
	}
	if _, err := txn.Tx().Exec(ctx, `INSERT INTO `+fx+` (k) VALUES ('m')`); err != nil {
		t.Fatal(err)
	}
	proxy.LoseNextAnswer()
	err = txn.Commit(ctx)
	if err == nil {
		t.Fatal("commit succeeded although its answer was cut")
	}
	if !postgres.IsTransient(err) {
		t.Fatalf("commit whose answer was lost: %v is not transient", err)
	}
	t.Logf("commit whose answer was lost (transient): %v", err)
	if err := txn.Rollback(ctx); err != nil {
		t.Fatalf("rollback after the lost commit: %v", err)
	}
	// The redelivery, on a new connection: the commit had landed.
	txn, err = s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Rollback(ctx)
	if res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "m"}}); err != nil || res[0] != driver.ClaimDuplicate {
		t.Fatalf("claim of the redelivery: %v %v; want duplicate (the commit landed)", res, err)
	}
	var n int
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM `+fx).Scan(&n); err != nil || n != 1 {
		t.Fatalf("effects: %d, %v; want 1", n, err)
	}
}
