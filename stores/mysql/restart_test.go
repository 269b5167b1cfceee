package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/mysql"
)

// privateMariaDB starts a throw-away MariaDB server of its own (the shared
// one must not be restarted under other tests) and returns its DSN and a
// function that restarts it. Without the server binaries the test skips,
// or fails when IDEMQ_REQUIRE_SERVICES=1.
func privateMariaDB(t *testing.T) (string, func()) {
	t.Helper()
	install, err1 := exec.LookPath("mariadb-install-db")
	server := "/usr/sbin/mariadbd"
	_, err2 := os.Stat(server)
	if err1 != nil || err2 != nil {
		servicetest.Unavailable(t, "no MariaDB server binaries (mariadb-install-db, /usr/sbin/mariadbd) to start a private server")
	}
	dir, err := os.MkdirTemp("", "idemq-my-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	user := "--user=" + os.Getenv("USER")
	if os.Geteuid() == 0 {
		user = "--user=root"
	}
	if out, err := exec.Command(install, "--no-defaults", "--datadir="+data, "--auth-root-authentication-method=normal",
		"--skip-test-db", user).CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dsn := fmt.Sprintf("root:@tcp(127.0.0.1:%d)/mysql?timeout=2s", port)
	var cmd *exec.Cmd
	start := func() {
		t.Helper()
		logf, err := os.OpenFile(filepath.Join(dir, "err.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer logf.Close()
		cmd = exec.Command(server, "--no-defaults", "--datadir="+data, fmt.Sprintf("--port=%d", port),
			"--socket="+filepath.Join(dir, "sock"), "--bind-address=127.0.0.1", user,
			"--innodb-buffer-pool-size=16M", "--skip-log-bin")
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if err := db.Ping(); err == nil {
				return
			} else if time.Now().After(deadline) {
				log, _ := os.ReadFile(filepath.Join(dir, "err.log"))
				t.Fatalf("private MariaDB did not start: %v\n%s", err, log)
			}
		}
	}
	stop := func() {
		// SIGTERM is a clean shutdown: open transactions are rolled back.
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	start()
	t.Cleanup(stop)
	return dsn, func() { stop(); start() }
}

// TestServerRestartBetweenClaimAndCommit restarts the server after a
// transaction claimed an id and applied its effect: the commit fails with
// a transient error, neither the claim nor the effect survives, and the
// redelivery after the restart applies the effect once.
func TestServerRestartBetweenClaimAndCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private MariaDB server; not in -short")
	}
	dsn, restart := privateMariaDB(t)
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
