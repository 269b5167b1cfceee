package mysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/mysql"
)

// TestServerRestartBetweenClaimAndCommit restarts the server after a
// transaction claimed an id and applied its effect: the commit fails with
// a transient error, neither the claim nor the effect survives, and the
// redelivery after the restart applies the effect once.
func TestServerRestartBetweenClaimAndCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private MariaDB server; not in -short")
	}
	srv := servicetest.StartMariaDB(t)
	dsn, restart := srv.DSN, srv.Restart
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := mysql.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db := s.DB()
	if _, err := db.Exec(`CREATE TABLE effects (k VARBINARY(255) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	process := func() (driver.ClaimResult, driver.Txn[*sql.Tx], error) {
		txn, err := s.Begin(ctx)
		if err != nil {
			return 0, nil, err
		}
		res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "m"}})
		if err != nil {
			return 0, txn, err
		}
		if res[0] == driver.ClaimWon {
			_, err = txn.Tx().ExecContext(ctx, `INSERT INTO effects VALUES ('m')`)
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
	if !mysql.IsTransient(err) {
		t.Fatalf("commit error after restart is not transient: %v", err)
	}
	t.Logf("commit after restart (transient): %v", err)
	if err := txn.Rollback(ctx); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	// The redelivery: database/sql reconnects, the claim is free again.
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
	if err := db.QueryRow(`SELECT count(*) FROM effects`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("effects: %d, %v; want 1", n, err)
	}
}
