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
// server switch does): the caller gets a transient error, so the Consumer
// retries, and the redelivery's claim agrees with what the server did: a
// duplicate when the commit landed (nearly always), the message applied
// when it did not; the effect is never applied twice.
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
	t.Cleanup(func() { db.Close() }) // after openStore's cleanup, which drops the tables through it
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
	// The redelivery, on a new connection. Whether the commit landed is
	// the server's to say (nearly always it did: the answer, not the
	// request, was cut); what must hold is that the claim agrees with the
	// effect: Duplicate with the effect applied once, or Won with no
	// effect, never Won over an applied effect.
	var res []driver.ClaimResult
	for try := 1; ; try++ {
		txn, err = s.Begin(ctx)
		if err == nil {
			res, err = txn.Claim(ctx, "c", []driver.Claim{{ID: "m"}})
			txn.Rollback(ctx)
		}
		if err == nil || try == 3 || !mysql.IsTransient(err) {
			break
		}
		t.Logf("claim of the redelivery, try %d: %v (transient)", try, err)
	}
	if err != nil {
		t.Fatalf("claim of the redelivery: %v", err)
	}
	var n int
	if err := direct.QueryRow(`SELECT count(*) FROM ` + fx).Scan(&n); err != nil {
		t.Fatal(err)
	}
	switch {
	case res[0] == driver.ClaimDuplicate && n == 1:
		t.Log("the commit had landed: the redelivery is a duplicate")
	case res[0] == driver.ClaimWon && n == 0:
		t.Log("the commit had not landed: the redelivery applies the message")
	default:
		t.Fatalf("claim of the redelivery %v with %d effects: the claim and the effect disagree", res, n)
	}
}
