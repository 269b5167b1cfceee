package rabbitmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/internal/servicetest"
)

// amqpURL returns the broker URL from IDEMQ_AMQP_URL (default the local
// broker). When the broker is unreachable the test is skipped, or fails
// when IDEMQ_REQUIRE_SERVICES=1.
func amqpURL(t testing.TB) string {
	t.Helper()
	return servicetest.RabbitMQURL(t)
}

// uniqueQueue returns a fresh queue name and deletes it (and the dead-letter
// and retry queues named after it) when the test ends.
func uniqueQueue(t testing.TB, url string) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	q := "idemq-test-" + hex.EncodeToString(b)
	servicetest.DeleteQueuesAtCleanup(t, url, q)
	return q
}

// testChannel opens a connection of the test's own to url and returns a
// channel on it; the connection closes when the test ends.
func testChannel(t testing.TB, url string) *amqp.Channel {
	t.Helper()
	ch, done := dialChannel(t, url)
	t.Cleanup(done)
	return ch
}

// dialChannel opens a connection to url and a channel on it, for helpers
// called often, which close the connection (done) when they return.
func dialChannel(t testing.TB, url string) (ch *amqp.Channel, done func()) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	if ch, err = conn.Channel(); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	return ch, func() { conn.Close() }
}

// openTestSource opens a Source, logging to the test, on a fresh queue of
// the broker at amqpURL, and starts it for a Consumer with the default
// window; it closes when the test ends.
func openTestSource(t testing.TB, opts ...Option) (url, queue string, src *Source, r *brokertest.Receiver) {
	t.Helper()
	url = amqpURL(t)
	queue = uniqueQueue(t, url)
	src, err := Open(context.Background(), url, append([]Option{WithQueue(queue), WithLogger(testLogger(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return url, queue, src, brokertest.StartReceiver(t, src, 0)
}

// queueDepth returns the number of ready messages in queue.
func queueDepth(t testing.TB, url, queue string) int {
	t.Helper()
	ch, done := dialChannel(t, url)
	defer done()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect %s: %v", queue, err)
	}
	return q.Messages
}

// drainQueue takes every ready message out of queue (auto-ack).
func drainQueue(t testing.TB, url, queue string) []amqp.Delivery {
	t.Helper()
	ch, done := dialChannel(t, url)
	defer done()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// proxy is a TCP proxy in front of the broker whose connections the test
// can cut, to inject connection loss into one client only.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cuts   int
	down   bool // refuse new connections, as a broker that is down
	// refused holds when each connection was refused while down.
	refused []time.Time
	wg      sync.WaitGroup
}

// refusals returns when each connection was refused while down.
func (p *proxy) refusals() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.refused...)
}

// setDown makes the proxy refuse (accept and close) new connections.
func (p *proxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		if down {
			p.refused = append(p.refused, time.Now())
		}
		p.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(u, c); u.Close() }()
		go func() { defer p.wg.Done(); io.Copy(c, u); c.Close() }()
	}
}

// cut closes every proxied connection, as a network failure would.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.cuts++
}

// receiveN receives n deliveries through r or fails the test after
// timeout.
func receiveN(t testing.TB, r *brokertest.Receiver, n int, timeout time.Duration) []*brokertest.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out := make([]*brokertest.Delivery, 0, n)
	for len(out) < n {
		d, err := r.Receive(ctx)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("received %d of %d deliveries before the timeout", len(out), n)
			}
			t.Logf("receive: %v", err)
			continue
		}
		out = append(out, d)
	}
	return out
}

// needRabbitmqctl skips the test unless rabbitmqctl can manage the broker
// at url (it must be the local one).
func needRabbitmqctl(t testing.TB, url string) {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Skip("rabbitmqctl not in PATH: cannot make the broker close a connection")
	}
	if hp, _ := parseAMQP(url); !strings.HasPrefix(hp, "127.0.0.1:") && !strings.HasPrefix(hp, "localhost:") {
		t.Skip("IDEMQ_AMQP_URL is not the local broker rabbitmqctl manages")
	}
}

// closeConnectionNamed makes the broker close (CONNECTION_FORCED) every
// connection whose connection_name client property is name, and returns
// how many it closed. Only the test's own connections carry its name.
func closeConnectionNamed(t testing.TB, name string) int {
	t.Helper()
	conns := connectionsNamed(t, name)
	for _, conn := range conns {
		if out, err := exec.Command("rabbitmqctl", "-q", "close_connection", conn, "idemq test").CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl close_connection: %v\n%s", err, out)
		}
	}
	return len(conns)
}

// connectionsNamed returns the pids of the connections whose
// connection_name client property is name, as rabbitmqctl lists them.
func connectionsNamed(t testing.TB, name string) []string {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	if err != nil {
		// rabbitmqctl needs the node's Erlang cookie (root here).
		servicetest.Unavailable(t, "rabbitmqctl list_connections: %v\n%s", err, out)
	}
	var pids []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, `{"connection_name","`+name+`"}`) {
			pid, _, _ := strings.Cut(line, "\t")
			pids = append(pids, pid)
		}
	}
	return pids
}

// consumersOf returns the info item (a column of rabbitmqctl
// list_consumers, such as prefetch_count or consumer_tag) of each consumer
// of queue.
func consumersOf(queue, item string) ([]string, error) {
	out, err := exec.Command("rabbitmqctl", "-q", "list_consumers", "queue_name", item).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("rabbitmqctl list_consumers: %v\n%s", err, out)
	}
	var values []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == queue {
			values = append(values, f[1])
		}
	}
	return values, nil
}

// closeLeavingOnly closes r and checks that queue q holds only the message
// id: every other one was acked before the connection closed.
func closeLeavingOnly(t *testing.T, r *brokertest.Receiver, url, q, id string) {
	t.Helper()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	left := drainQueue(t, url, q)
	if len(left) != 1 || left[0].MessageId != id {
		t.Fatalf("left in the queue: %d messages, want only %s", len(left), id)
	}
}
