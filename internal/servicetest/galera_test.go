package servicetest_test

import (
	"database/sql"
	"testing"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/internal/servicetest"
)

// A private three-node Galera cluster forms, replicates a write to every
// node, and takes a node killed with SIGKILL back by state transfer, with
// what was written meanwhile.
func TestGaleraCluster(t *testing.T) {
	c := servicetest.StartGalera(t, 3)
	open := func(i int) *sql.DB {
		db, err := sql.Open("mysql", c.Nodes[i].DSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	count := func(db *sql.DB) (n int) {
		t.Helper()
		// wsrep_sync_wait makes the read wait for what the cluster committed.
		if _, err := db.Exec(`SET SESSION wsrep_sync_wait = 1`); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(`SELECT count(*) FROM test.t`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	db0 := open(0)
	for _, q := range []string{`CREATE DATABASE test`, `CREATE TABLE test.t (id INT PRIMARY KEY)`, `INSERT INTO test.t VALUES (1)`} {
		if _, err := db0.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(open(2)); n != 1 {
		t.Fatalf("node 2 sees %d rows, want the 1 written on node 0", n)
	}
	c.Nodes[2].Kill()
	c.WaitSynced(0, 2)
	if _, err := open(1).Exec(`INSERT INTO test.t VALUES (2)`); err != nil {
		t.Fatal(err)
	}
	c.Rejoin(2)
	db2 := open(2)
	if n := count(db2); n != 2 {
		t.Fatalf("rejoined node 2 sees %d rows, want 2", n)
	}
}
