package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/servicetest"
)

// rabbitConnections lists the client-provided names of the broker's
// connections.
func rabbitConnections(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	if err != nil {
		servicetest.Unavailable(t, "rabbitmqctl list_connections (it manages the local broker only): %v\n%s", err, out)
	}
	return string(out)
}

// rabbitConnection returns the broker's id of the connection named name,
// "" when there is none.
func rabbitConnection(t *testing.T, name string) string {
	t.Helper()
	for _, line := range strings.Split(rabbitConnections(t), "\n") {
		if strings.Contains(line, `{"connection_name","`+name+`"}`) {
			pid, _, _ := strings.Cut(line, "\t")
			return pid
		}
	}
	return ""
}

// The service's --log-level governs the adapters' warnings too: they go to
// the service's logger (its handler and level), not to slog.Default().
func TestLogLevelReachesAdapterWarnings(t *testing.T) {
	u := amqpURL(t)
	if !strings.Contains(u, "127.0.0.1") && !strings.Contains(u, "localhost") {
		t.Skip("IDEMQ_AMQP_URL is not the local broker rabbitmqctl manages")
	}
	bin := serviceBinary(t)
	for _, c := range []struct {
		level string
		want  []string // lines the service's text handler writes
		never []string
	}{
		{"info", []string{`level=WARN msg="idemq rabbitmq: connection lost, reconnecting"`, `level=INFO msg="idemq rabbitmq: reconnected"`}, nil},
		{"error", nil, []string{"idemq rabbitmq"}},
	} {
		t.Run(c.level, func(t *testing.T) {
			q := amqpQueue(t, u)
			name := "idemq-payments-" + randomHex(4)
			var stderr servicetest.Buffer
			cmd := exec.Command(bin, "--broker", u+"?queue="+q+"&connection_name="+name,
				"--store", "sqlite://"+filepath.Join(t.TempDir(), "ledger.db"), "--log-level", c.level)
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				cmd.Process.Signal(syscall.SIGTERM)
				cmd.Wait()
			}()
			var first string
			servicetest.WaitFor(t, 30*time.Second, "the service connected", func() bool {
				first = rabbitConnection(t, name)
				return first != ""
			})
			if out, err := exec.Command("rabbitmqctl", "-q", "close_connection", first, "idemq payments test").CombinedOutput(); err != nil {
				t.Fatalf("rabbitmqctl close_connection: %v\n%s", err, out)
			}
			servicetest.WaitFor(t, 30*time.Second, "the service reconnected", func() bool {
				again := rabbitConnection(t, name)
				return again != "" && again != first
			})
			// The reconnect's lines are written around the new connection.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				if c.want == nil || strings.Contains(stderr.String(), c.want[len(c.want)-1]) {
					break
				}
			}
			out := stderr.String()
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("--log-level %s: stderr lacks %s:\n%s", c.level, w, out)
				}
			}
			for _, n := range c.never {
				if strings.Contains(out, n) {
					t.Errorf("--log-level %s: stderr has %q, below the level:\n%s", c.level, n, out)
				}
			}
		})
	}
}
