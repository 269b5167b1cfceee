package tlstest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/servicetest"
)

// unavailable skips t, or fails it when IDEMQ_REQUIRE_SERVICES=1, because a
// service the test needs cannot be started here.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	servicetest.Unavailable(t, format, args...)
}

// Certs generates a fresh set of certificates in a new directory that the
// named system user (a server's own user, such as "postgres" or
// "rabbitmq") can read, and removes it when the test ends. With an empty
// owner, or when the test does not run as root, the files keep the test's
// own user.
func Certs(t testing.TB, owner string) *Files {
	t.Helper()
	// Not t.TempDir: its parents are private to the test's user, and the
	// server, running as its own user, must reach the files.
	dir, err := os.MkdirTemp("", "idemq-tls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := Generate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if owner != "" && os.Geteuid() == 0 {
		u, err := user.Lookup(owner)
		if err != nil {
			unavailable(t, "no %s user to give the server's key to: %v", owner, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := f.Chown(uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// RabbitMQListener adds a TLS listener on a free loopback port to the
// local RabbitMQ node at run time (rabbitmqctl eval, no restart, so other
// tests using the node are not disturbed) with f's server certificate, and
// removes it when the test ends. The listener verifies client
// certificates against f.CA when one is sent; with requireClientCert it
// refuses clients that send none. f must be readable by the rabbitmq user
// (Certs(t, "rabbitmq")). It returns the port.
func RabbitMQListener(t testing.TB, f *Files, requireClientCert bool) int {
	t.Helper()
	ctl, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		unavailable(t, "rabbitmqctl not found: a RabbitMQ TLS listener is added to the local node with it")
	}
	port := servicetest.FreePort(t)
	opts := fmt.Sprintf(`[{cacertfile,%q},{certfile,%q},{keyfile,%q},{verify,verify_peer},{fail_if_no_peer_cert,%t}]`,
		f.CA, f.ServerCert, f.ServerKey, requireClientCert)
	start := fmt.Sprintf(`rabbit_networking:start_ssl_listener({"127.0.0.1", %d}, %s, 1).`, port, opts)
	out, err := exec.Command(ctl, "eval", start).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		unavailable(t, "starting a RabbitMQ TLS listener on 127.0.0.1:%d: %v: %s", port, err, out)
	}
	t.Cleanup(func() {
		stop := fmt.Sprintf(`rabbit_networking:stop_tcp_listener({"127.0.0.1", %d}).`, port)
		if out, err := exec.Command(ctl, "eval", stop).CombinedOutput(); err != nil {
			t.Logf("removing the RabbitMQ TLS listener on %d: %v: %s", port, err, out)
		}
	})
	waitPort(t, port)
	return port
}

// RabbitMQUser creates a RabbitMQ user with full rights on vhost "/" and
// deletes it when the test ends, so a test can use a password that is
// really checked.
func RabbitMQUser(t testing.TB, name, password string) {
	t.Helper()
	ctl, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		unavailable(t, "rabbitmqctl not found: needed to create a RabbitMQ user")
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ctl, args...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl %s: %v: %s", args[0], err, out)
		}
	}
	run("add_user", name, password)
	t.Cleanup(func() { exec.Command(ctl, "delete_user", name).Run() })
	run("set_permissions", "-p", "/", name, ".*", ".*", ".*")
}

// Postgres starts a private, throw-away PostgreSQL server on a free
// loopback port with TLS on (f's server certificate) and stops it when
// the test ends; the shared server is never reconfigured. It listens on
// 127.0.0.1 and 127.0.0.2, an address the certificate does not name. Connections
// without TLS are refused by pg_hba.conf, so a test that connects has
// used TLS. User postgres logs in without a password, role idemq-client
// (if created) with f's client certificate only, every other role with its
// password (scram-sha-256). f must belong to the postgres user
// (Certs(t, "postgres")). It returns the port.
func Postgres(t testing.TB, f *Files) int {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(bins) == 0 {
		unavailable(t, "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin) to start a private TLS server")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	cmd := func(name string, args ...string) *exec.Cmd {
		if os.Geteuid() == 0 {
			return exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(bin, name)}, args...)...)
		}
		return exec.Command(filepath.Join(bin, name), args...)
	}
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := cmd(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	data := filepath.Join(f.Dir, "pgdata")
	run("initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
	hba := "local all all trust\n" +
		"hostssl all postgres 127.0.0.0/8 trust\n" +
		"hostssl all idemq-client 127.0.0.0/8 cert\n" +
		"hostssl all all 127.0.0.0/8 scram-sha-256\n" +
		"hostnossl all all 0.0.0.0/0 reject\n"
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chown", "postgres", filepath.Join(data, "pg_hba.conf")).CombinedOutput(); err != nil {
			t.Fatalf("chown pg_hba.conf: %v: %s", err, out)
		}
	}
	port := servicetest.FreePort(t)
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1,127.0.0.2 -c fsync=off -c ssl=on -c ssl_cert_file=%s -c ssl_key_file=%s -c ssl_ca_file=%s",
		port, f.Dir, f.ServerCert, f.ServerKey, f.CA)
	run("pg_ctl", "-D", data, "-o", opts, "-l", filepath.Join(f.Dir, "pg.log"), "-w", "start")
	t.Cleanup(func() { cmd("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop").Run() })
	return port
}

// MariaDB starts a private, throw-away MariaDB server on a free loopback
// port with TLS on (f's server certificate) and stops it when the test
// ends. Its root user logs in from 127.0.0.1 without a password, and
// every TCP connection must use TLS (require_secure_transport). The server
// runs as the test's user (root runs it as root, as the restart tests do),
// so Certs(t, "") suffices. It returns the port.
func MariaDB(t testing.TB, f *Files) int {
	t.Helper()
	mariadbd, err := exec.LookPath("mariadbd")
	if err != nil {
		if _, err2 := os.Stat("/usr/sbin/mariadbd"); err2 != nil {
			unavailable(t, "no mariadbd to start a private TLS server")
		}
		mariadbd = "/usr/sbin/mariadbd"
	}
	install, err := exec.LookPath("mariadb-install-db")
	if err != nil {
		unavailable(t, "no mariadb-install-db to start a private TLS server")
	}
	data := filepath.Join(f.Dir, "mydata")
	args := []string{"--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal", "--skip-test-db"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	if out, err := exec.Command(install, args...).CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	port := servicetest.FreePort(t)
	sock := filepath.Join(f.Dir, "my.sock")
	srv := exec.Command(mariadbd, "--no-defaults", "--datadir="+data, "--port="+strconv.Itoa(port),
		"--bind-address=127.0.0.1", "--socket="+sock, "--require-secure-transport=ON",
		"--ssl-ca="+f.CA, "--ssl-cert="+f.ServerCert, "--ssl-key="+f.ServerKey,
		"--innodb-buffer-pool-size=16M", "--skip-log-bin", "--innodb-flush-log-at-trx-commit=0",
		"--pid-file="+filepath.Join(f.Dir, "my.pid"))
	if os.Geteuid() == 0 {
		srv.Args = append(srv.Args, "--user=root")
	}
	logf, err := os.Create(filepath.Join(f.Dir, "my.log"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Stdout, srv.Stderr = logf, logf
	if err := srv.Start(); err != nil {
		t.Fatalf("mariadbd: %v", err)
	}
	t.Cleanup(func() {
		srv.Process.Kill()
		srv.Wait()
		logf.Close()
	})
	waitPort(t, port)
	return port
}

func waitPort(t testing.TB, port int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on 127.0.0.1:%d after 30s: %v", port, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
