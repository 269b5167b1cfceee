package mysql_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/mysql"

	mysqldrv "github.com/go-sql-driver/mysql"
)

// TestCommitOutcomeLost sends a commit whose answer never comes back (the
// connection is cut once COMMIT is on its way, as a network failure or a
// server switch does): the commit lands on the server, the caller gets a
// transient error, so the Consumer retries, and the redelivery's claim is
// a duplicate: the effect stays applied once.
func TestCommitOutcomeLost(t *testing.T) {
	direct := testDB(t)
	cfg, err := mysql.ParseDSN(mysqlDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Net != "tcp" {
		t.Skipf("the server is reached over %s; the proxy speaks TCP", cfg.Net)
	}
	proxy := servicetest.StartProxy(t, cfg.Addr)
	cfg.Addr = proxy.Addr
	cfg.InterpolateParams = true
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	s := openStore(t, db)
	fx := effectsTable(t, direct)
	ctx := context.Background()

	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "m"}}); err != nil || res[0] != driver.ClaimWon {
		t.Fatalf("claim: %v %v", res, err)
	}
	if _, err := txn.Tx().ExecContext(ctx, `INSERT INTO `+fx+` (k) VALUES ('m')`); err != nil {
		t.Fatal(err)
	}
	proxy.LoseNextAnswer()
	err = txn.Commit(ctx)
	if err == nil {
		t.Fatal("commit succeeded although its answer was cut")
	}
	if !mysql.IsTransient(err) {
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
	if err := direct.QueryRow(`SELECT count(*) FROM ` + fx).Scan(&n); err != nil || n != 1 {
		t.Fatalf("effects: %d, %v; want 1", n, err)
	}
}
