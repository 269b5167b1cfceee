package servicetest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestPostgresPair starts a synchronous pair, writes through the pair's
// multi-host URL, finds the row on the standby, then stops the primary,
// promotes the standby and writes through the same URL again: the new
// primary has both rows.
func TestPostgresPair(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two private PostgreSQL servers; not in -short")
	}
	p := StartPostgresPair(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exec := func(url, sql string) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, sql)
		return err
	}
	count := func(url string) int {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := exec(p.URL, `CREATE TABLE t (k int); INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	// Synchronous: the commit returned once the standby had flushed it;
	// replaying it may take a moment longer.
	WaitFor(t, 10*time.Second, "the row on the standby", func() bool { return count(p.Standby.URL) == 1 })
	if err := exec(p.Standby.URL, `INSERT INTO t VALUES (2)`); err == nil {
		t.Fatal("the standby took a write before its promotion")
	}
	p.StopPrimary()
	if err := exec(p.URL, `INSERT INTO t VALUES (2)`); err == nil {
		t.Fatal("the pair's URL took a write with the primary stopped and the standby not promoted")
	}
	p.Promote()
	if err := exec(p.URL, `INSERT INTO t VALUES (2)`); err != nil {
		t.Fatalf("write after promotion: %v", err)
	}
	if n := count(p.URL); n != 2 {
		t.Fatalf("rows on the new primary: %d, want 2", n)
	}
}
