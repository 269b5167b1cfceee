package servicetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// NATSEnv holds the URL of the NATS server (with JetStream) the tests
	// use.
	NATSEnv = "IDEMQ_NATS_URL"
	// NATSDefault is the local NATS server.
	NATSDefault = "nats://127.0.0.1:4222"
	// NATSServerBinary is the nats-server StartNATS runs.
	NATSServerBinary = "/usr/sbin/nats-server"
)

// NATSURL returns IDEMQ_NATS_URL (default the local server) once a
// connection to it has found JetStream enabled; unreachable, it skips t
// (or fails it with IDEMQ_REQUIRE_SERVICES=1) naming the variable.
func NATSURL(t testing.TB) string {
	t.Helper()
	return URL(t, NATSEnv, NATSDefault, PingNATS)
}

// PingNATS connects to the NATS server at u and asks for its JetStream
// account information.
func PingNATS(ctx context.Context, u string) error {
	timeout := Timeout
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	nc, err := natsgo.Connect(u, natsgo.Timeout(timeout), natsgo.NoReconnect())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.AccountInfo(ctx)
	return err
}

// NATSServer is a throw-away nats-server of a test's own with JetStream,
// storing in a temporary directory, on a free loopback port: tests that
// stop or restart a server, or configure its security, use one, never the
// shared server on 4222. It stops when the test ends.
type NATSServer struct {
	// URL is nats://127.0.0.1:PORT, without credentials.
	URL string
	// Port is the loopback port the server listens on.
	Port int
	// Dir is the server's directory: its JetStream store, its log and
	// its configuration file.
	Dir string

	t    testing.TB
	args []string
	process
}

// StartNATS starts a private nats-server with JetStream. config, if not
// empty, is the content of a configuration file (authorization, tls, …)
// the server is started with; the command line's address, port and
// JetStream store take precedence over it. Without the binary the test
// skips, or fails when IDEMQ_REQUIRE_SERVICES=1.
func StartNATS(t testing.TB, config string) *NATSServer {
	t.Helper()
	s := newNATS(t, config)
	s.Start()
	return s
}

// newNATS prepares a private nats-server without starting it.
func newNATS(t testing.TB, config string) *NATSServer {
	t.Helper()
	if _, err := os.Stat(NATSServerBinary); err != nil {
		Unavailable(t, "no %s to start a private NATS server", NATSServerBinary)
	}
	dir := t.TempDir()
	s := &NATSServer{t: t, Dir: dir, Port: FreePort(t)}
	s.URL = fmt.Sprintf("nats://127.0.0.1:%d", s.Port)
	s.args = []string{"-a", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-js", "-sd", filepath.Join(dir, "js"), "-l", filepath.Join(dir, "server.log")}
	if config != "" {
		conf := filepath.Join(dir, "server.conf")
		if err := os.WriteFile(conf, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		s.args = append(s.args, "-c", conf)
	}
	t.Cleanup(s.Stop)
	return s
}

// Start starts the server and waits until it accepts connections.
func (s *NATSServer) Start() {
	s.t.Helper()
	cmd := exec.Command(NATSServerBinary, s.args...)
	if err := s.start(cmd); err != nil {
		s.t.Fatal(err)
	}
	done := s.exited()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.Port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			s.t.Fatalf("private nats-server exited at start:\n%s", s.Log())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("private nats-server did not start: %v\n%s", err, s.Log())
		}
	}
}

// Stop shuts the server down (SIGTERM, then a kill after 20s). Stopping a
// stopped server does nothing.
func (s *NATSServer) Stop() {
	s.stop(20 * time.Second)
}

// Kill stops the server as a crash does (SIGKILL).
func (s *NATSServer) Kill() {
	s.stop(0)
}

// Restart stops the server and starts it again on the same port and store.
func (s *NATSServer) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

// Log returns the server's log so far.
func (s *NATSServer) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "server.log"))
	return string(b)
}

// DeleteStreamsAtCleanup deletes the JetStream streams named when the test
// ends (those that exist), so tests that let an adapter declare streams on
// the shared server leave nothing behind.
func DeleteStreamsAtCleanup(t testing.TB, url string, streams ...string) {
	t.Cleanup(func() {
		nc, err := natsgo.Connect(url, natsgo.Timeout(Timeout), natsgo.NoReconnect())
		if err != nil {
			t.Logf("deleting streams %v: %v", streams, err)
			return
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		defer cancel()
		for _, s := range streams {
			if err := js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Logf("deleting stream %s: %v", s, err)
			}
		}
	})
}
