package postgres_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// privatePostgres starts a throw-away PostgreSQL server of its own (the
// shared one must not be restarted under other tests) and returns its URL
// and a function that restarts it. Without the server binaries the test
// skips, or fails when IDEMQ_REQUIRE_SERVICES=1.
func privatePostgres(t *testing.T) (string, func()) {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(bins) == 0 {
		servicetest.Unavailable(t, "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin) to start a private server")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	dir, err := os.MkdirTemp("", "idemq-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// PostgreSQL refuses to run as root: run it as the postgres user.
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, name), args...)
		if os.Geteuid() == 0 {
			cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(bin, name)}, args...)...)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root without a postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	data := filepath.Join(dir, "data")
	run("initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", port, dir)
	logFile := filepath.Join(dir, "log")
	run("pg_ctl", "-D", data, "-o", opts, "-l", logFile, "-w", "start")
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
		if os.Geteuid() == 0 {
			cmd = exec.Command("runuser", "-u", "postgres", "--", filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
		}
		cmd.Run()
	})
	restart := func() { run("pg_ctl", "-D", data, "-o", opts, "-l", logFile, "-m", "fast", "-w", "restart") }
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", port), restart
}

// TestServerRestartBetweenClaimAndCommit restarts the server after a
// transaction claimed an id and applied its effect: the commit fails with
// a transient error, neither the claim nor the effect survives, and the
// redelivery after the restart applies the effect once.
func TestServerRestartBetweenClaimAndCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL server; not in -short")
	}
	url, restart := privatePostgres(t)
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
