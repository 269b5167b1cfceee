package servicetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresServer is a throw-away PostgreSQL server of a test's own, in a
// temporary directory, on a free loopback port: tests that stop, restart
// or promote a server use one, never the shared server on 5432. The
// server and its directory go when the test ends, whether it passed or
// not.
type PostgresServer struct {
	// URL is the server's postgres:// URL (user postgres, trust
	// authentication, database postgres).
	URL string
	// Port is the loopback port the server listens on.
	Port int

	t    testing.TB
	bin  string // the directory of initdb, pg_ctl, …
	dir  string // the temporary directory: socket, log, data
	data string // the data directory
	opts string // the server options pg_ctl passes with -o
}

// PostgresPair is a private primary and a streaming standby made from it
// with pg_basebackup -R, each a PostgresServer, as StartPostgresPair starts
// them.
type PostgresPair struct {
	// Primary is the server that takes writes when the pair starts.
	Primary *PostgresServer
	// Standby is a hot standby streaming from Primary; it takes writes
	// once promoted.
	Standby *PostgresServer
	// URL names both servers, primary first, with
	// target_session_attrs=read-write: pgx connects to whichever of them
	// takes writes.
	URL string
	// Synchronous reports whether the primary waits, at each commit, for
	// the standby to have flushed the commit's WAL
	// (synchronous_standby_names='*', synchronous_commit=on).
	Synchronous bool
}

// postgresBin returns the directory of the newest installed PostgreSQL
// server binaries, or ends t with Unavailable.
func postgresBin(t testing.TB) string {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	for i := len(bins) - 1; i >= 0; i-- {
		dir := filepath.Dir(bins[i])
		if ok(filepath.Join(dir, "initdb")) && ok(filepath.Join(dir, "pg_basebackup")) {
			return dir
		}
	}
	Unavailable(t, "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin: initdb, pg_ctl, pg_basebackup) to start a private server")
	return ""
}

func ok(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// FreePort returns a loopback TCP port that was free a moment ago, once
// per process. It picks below the kernel's ephemeral range: a port from
// that range can be taken by any outgoing connection between this check
// and the server's bind (a Galera node's IST listener lost its port so).
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// freePort is FreePort for callers without a testing.TB.
func freePort() (int, error) {
	lo, hi := 20000, ephemeralStart()-1
	for range 1000 {
		p := lo + rand.IntN(hi-lo+1)
		if _, given := portsGiven.LoadOrStore(p, true); given {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l.Close()
		return p, nil
	}
	return 0, fmt.Errorf("servicetest: no free loopback port between %d and %d", lo, hi)
}

// portsGiven holds the ports FreePort handed out in this process.
var portsGiven sync.Map

// ephemeralStart is the first port of the kernel's ephemeral range
// (Linux's default 32768 where it cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if f := strings.Fields(string(b)); err == nil && len(f) == 2 {
		if n, err := strconv.Atoi(f[0]); err == nil && n > 21000 {
			return n
		}
	}
	return 32768
}

// newPostgresServer prepares (without initdb) a server in a new temporary
// directory that the test's end removes, after stopping the server.
func newPostgresServer(t testing.TB, bin string) *PostgresServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "idemq-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// PostgreSQL refuses to run as root: as root, the postgres user runs it.
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			Unavailable(t, "running as root without a postgres user to run a private PostgreSQL server: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	s := &PostgresServer{t: t, bin: bin, dir: dir, data: filepath.Join(dir, "data"), Port: FreePort(t)}
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", s.Port)
	s.opts = fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", s.Port, dir)
	// Registered before the server starts, so a start that fails half
	// way is cleaned up too (cleanups run last registered first: the
	// server stops before its directory goes).
	t.Cleanup(func() { s.pgCtl("-m", "immediate", "-w", "stop") })
	return s
}

// command returns the exec.Cmd running the binary name with args, as the
// postgres user when the test runs as root.
func (s *PostgresServer) command(name string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, name)
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

// run runs the binary name with args and fails the test, with its output
// and the server log, when it fails.
func (s *PostgresServer) run(name string, args ...string) {
	s.t.Helper()
	if out, err := s.command(name, args...).CombinedOutput(); err != nil {
		s.t.Fatalf("%s %s: %v\n%s\nserver log:\n%s", name, strings.Join(args, " "), err, out, s.Log())
	}
}

// pgCtl runs pg_ctl on the server's data directory, ignoring failures
// (for cleanups: the server may be stopped already).
func (s *PostgresServer) pgCtl(args ...string) {
	s.command("pg_ctl", append([]string{"-D", s.data}, args...)...).Run()
}

// StartPostgres initialises and starts a private PostgreSQL server, with
// fsync off (its data is thrown away). Without the server binaries the
// test skips, or fails when IDEMQ_REQUIRE_SERVICES=1.
func StartPostgres(t testing.TB) *PostgresServer {
	t.Helper()
	s := newPostgresServer(t, postgresBin(t))
	s.initdb()
	s.Start()
	return s
}

// initdb creates the data directory: trust authentication on loopback,
// replication included.
func (s *PostgresServer) initdb() {
	s.t.Helper()
	s.run("initdb", "-D", s.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
	s.appendConf("pg_hba.conf", "host replication all 127.0.0.1/32 trust\n")
	s.appendConf("postgresql.conf", "fsync = off\n")
}

// appendConf appends text to the configuration file name of the data
// directory.
func (s *PostgresServer) appendConf(name, text string) {
	s.t.Helper()
	f, err := os.OpenFile(filepath.Join(s.data, name), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		s.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		s.t.Fatal(err)
	}
}

// Start starts the server and waits until it accepts connections.
func (s *PostgresServer) Start() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.data, "-o", s.opts, "-l", filepath.Join(s.dir, "log"), "-w", "-t", "60", "start")
}

// Stop shuts the server down fast: open transactions are rolled back and
// their connections closed (SQLSTATE 57P01).
func (s *PostgresServer) Stop() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.data, "-m", "fast", "-w", "-t", "60", "stop")
}

// Kill stops the server as a crash does (pg_ctl -m immediate): no
// shutdown checkpoint, connections cut, nothing more sent to a standby.
func (s *PostgresServer) Kill() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.data, "-m", "immediate", "-w", "-t", "60", "stop")
}

// Restart stops the server fast and starts it again on the same port.
func (s *PostgresServer) Restart() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.data, "-o", s.opts, "-l", filepath.Join(s.dir, "log"), "-m", "fast", "-w", "-t", "60", "restart")
}

// Promote turns a standby into a primary (pg_ctl promote) and waits until
// it takes writes.
func (s *PostgresServer) Promote() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.data, "-w", "-t", "60", "promote")
}

// Log returns the server's log so far.
func (s *PostgresServer) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "log"))
	return string(b)
}

// StartPostgresPair starts a private primary and a hot standby streaming
// from it (pg_basebackup -R), both on free loopback ports, and waits until
// the standby streams. With synchronous, the primary has
// synchronous_standby_names='*' and synchronous_commit=on: a commit returns
// only once the standby has flushed it, so a promoted standby has every
// commit a client saw succeed. The standby runs with
// synchronous_standby_names empty so that, promoted and alone, it does not
// wait for a standby of its own. Both servers go when the test ends.
// Without the server binaries the test skips, or fails when
// IDEMQ_REQUIRE_SERVICES=1.
func StartPostgresPair(t testing.TB, synchronous bool) *PostgresPair {
	t.Helper()
	bin := postgresBin(t)
	primary := newPostgresServer(t, bin)
	primary.initdb()
	primary.appendConf("postgresql.conf", "wal_level = replica\nmax_wal_senders = 5\nwal_keep_size = '256MB'\nhot_standby = on\nsynchronous_commit = on\n")
	if synchronous {
		primary.appendConf("postgresql.conf", "synchronous_standby_names = '*'\n")
	}
	primary.Start()

	standby := newPostgresServer(t, bin)
	standby.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.Port), "-U", "postgres",
		"-D", standby.data, "-R", "-X", "stream", "--no-sync", "-c", "fast")
	standby.appendConf("postgresql.conf", "synchronous_standby_names = ''\n")
	standby.Start()

	p := &PostgresPair{Primary: primary, Standby: standby, Synchronous: synchronous,
		URL: fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?target_session_attrs=read-write&connect_timeout=5",
			primary.Port, standby.Port)}
	want := "async"
	if synchronous {
		want = "sync"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, primary.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	WaitFor(t, time.Minute, "the standby to stream from the primary ("+want+")", func() bool {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = $1`, want).Scan(&n)
		return err == nil && n == 1
	})
	return p
}

// Promote promotes the standby: from then on it takes writes, and the
// pair's URL leads new connections to it once the primary is stopped or
// refuses writes.
func (p *PostgresPair) Promote() {
	p.Primary.t.Helper()
	p.Standby.Promote()
}

// StopPrimary stops the primary as a crash does (pg_ctl -m immediate).
func (p *PostgresPair) StopPrimary() {
	p.Primary.t.Helper()
	p.Primary.Kill()
}
