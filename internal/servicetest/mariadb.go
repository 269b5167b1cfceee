package servicetest

import (
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
)

// MariaDBServer is a throw-away MariaDB server of a test's own, in a
// temporary directory, on a free loopback port: tests that stop or restart
// a server use one, never the shared server on 3306. The server and its
// directory go when the test ends, whether it passed or not.
type MariaDBServer struct {
	// DSN is the server's go-sql-driver DSN (user root, no password,
	// database mysql, a 2s connect timeout).
	DSN string
	// Port is the loopback port the server listens on.
	Port int

	t      testing.TB
	server string
	dir    string
	user   string
	args   []string // more server options (a Galera node's)
	process
}

// StartMariaDB initialises (mariadb-install-db) and starts a private
// MariaDB server. Without the server binaries the test skips, or fails
// when IDEMQ_REQUIRE_SERVICES=1.
func StartMariaDB(t testing.TB) *MariaDBServer {
	t.Helper()
	s := newMariaDB(t)
	s.Start()
	return s
}

// newMariaDB initialises a private server's data directory, on a free
// port, without starting it.
func newMariaDB(t testing.TB) *MariaDBServer {
	t.Helper()
	install, err1 := exec.LookPath("mariadb-install-db")
	server := "/usr/sbin/mariadbd"
	_, err2 := os.Stat(server)
	if err1 != nil || err2 != nil {
		Unavailable(t, "no MariaDB server binaries (mariadb-install-db, /usr/sbin/mariadbd) to start a private server")
	}
	dir, err := os.MkdirTemp("", "idemq-my-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	user := "--user=" + os.Getenv("USER")
	if os.Geteuid() == 0 {
		user = "--user=root"
	}
	s := &MariaDBServer{t: t, server: server, dir: dir, user: user, Port: FreePort(t)}
	s.DSN = fmt.Sprintf("root:@tcp(127.0.0.1:%d)/mysql?timeout=2s", s.Port)
	if out, err := exec.Command(install, "--no-defaults", "--datadir="+s.data(), "--auth-root-authentication-method=normal",
		"--skip-test-db", user).CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	t.Cleanup(s.Stop)
	return s
}

func (s *MariaDBServer) data() string { return filepath.Join(s.dir, "data") }

// Start starts the server and waits until it answers a ping.
func (s *MariaDBServer) Start() {
	s.t.Helper()
	logf, err := os.OpenFile(filepath.Join(s.dir, "err.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(s.server, "--no-defaults", "--datadir="+s.data(), fmt.Sprintf("--port=%d", s.Port),
		"--socket="+filepath.Join(s.dir, "sock"), "--bind-address=127.0.0.1", s.user,
		"--innodb-buffer-pool-size=16M", "--skip-log-bin")
	cmd.Args = append(cmd.Args, s.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := s.start(cmd); err != nil {
		s.t.Fatal(err)
	}
	cfg, err := mysqldrv.ParseDSN(s.DSN)
	if err != nil {
		s.t.Fatal(err)
	}
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	done := s.exited()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := db.Ping()
		if err == nil {
			return
		}
		select {
		case <-done:
			s.t.Fatalf("private MariaDB exited at start:\n%s", s.Log())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("private MariaDB did not start: %v\n%s", err, s.Log())
		}
	}
}

// Stop shuts the server down cleanly (SIGTERM: open transactions are
// rolled back), or kills it after 30s. Stopping a stopped server does
// nothing.
func (s *MariaDBServer) Stop() {
	s.stop(30 * time.Second)
}

// Kill stops the server as a crash does (SIGKILL): nothing is flushed or
// rolled back. Killing a stopped server does nothing.
func (s *MariaDBServer) Kill() {
	s.stop(0)
}

// Restart stops the server cleanly and starts it again on the same port.
func (s *MariaDBServer) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

// Log returns the server's error log so far.
func (s *MariaDBServer) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "err.log"))
	return string(b)
}
