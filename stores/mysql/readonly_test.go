package mysql_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/mysql"
)

// TestReadOnlyServerIsTransient claims on a private MariaDB server set to
// read_only, as a primary demoted in a failover (or a replica) is: the
// claim fails with 1290 (--read-only), which is transient, not
// permanent, so the message is retried instead of dead-lettered, and the
// claim goes through once the server takes writes again.
func TestReadOnlyServerIsTransient(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private MariaDB server; not in -short")
	}
	srv := servicetest.StartMariaDB(t)
	ctx := context.Background()
	root, err := mysql.Open(ctx, srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	// read_only binds users without the READ ONLY ADMIN privilege: an
	// application user, not root.
	for _, stmt := range []string{
		`CREATE DATABASE app`,
		`CREATE USER 'app'@'%'`,
		`GRANT ALL ON app.* TO 'app'@'%'`,
	} {
		if _, err := root.DB().ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	dsn := strings.Replace(strings.Replace(srv.DSN, "root:@", "app:@", 1), ")/mysql", ")/app", 1)
	s, err := mysql.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	claim := func(id string) error {
		txn, err := s.Begin(ctx)
		if err != nil {
			return err
		}
		defer txn.Rollback(ctx)
		res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: id}})
		if err != nil {
			return err
		}
		if res[0] != driver.ClaimWon {
			t.Fatalf("claim %s: %v, want won", id, res[0])
		}
		return txn.Commit(ctx)
	}
	if err := claim("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.DB().ExecContext(ctx, `SET GLOBAL read_only = 1`); err != nil {
		t.Fatal(err)
	}
	err = claim("b")
	if err == nil {
		t.Fatal("claim on a read-only server succeeded")
	}
	if !mysql.IsTransient(err) {
		t.Fatalf("claim on a read-only server: %v is not transient", err)
	}
	t.Logf("claim on a read-only server (transient): %v", err)
	if _, err := root.DB().ExecContext(ctx, `SET GLOBAL read_only = 0`); err != nil {
		t.Fatal(err)
	}
	if err := claim("b"); err != nil {
		t.Fatalf("claim once the server takes writes again: %v", err)
	}
}
