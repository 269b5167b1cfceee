package redis

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// RedisEnv holds the URL of the Redis server (7.0 or later) the tests use,
// without a path: redis://[user:pass@]host:port.
const RedisEnv = "IDEMQ_REDIS_URL"

// RedisURL returns IDEMQ_REDIS_URL (default redis://127.0.0.1:6379) once
// the server there answered a PING; unreachable, it skips t (or fails it
// with IDEMQ_REQUIRE_SERVICES=1) naming the variable.
func RedisURL(t testing.TB) string {
	t.Helper()
	return strings.TrimRight(servicetest.URL(t, RedisEnv, "redis://127.0.0.1:6379", func(ctx context.Context, u string) error {
		c, err := rawClient(u)
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Ping(ctx).Err()
	}), "/")
}

func rawClient(u string) (*goredis.Client, error) {
	o, err := goredis.ParseURL(u)
	if err != nil {
		return nil, err
	}
	return goredis.NewClient(o), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testStream is a fresh stream on a server, deleted with its dead-letter
// stream when the test ends; rdb is a client of the test's own.
type testStream struct {
	base, name string
	rdb        *goredis.Client
}

func newTestStream(t testing.TB, base string) testStream {
	t.Helper()
	o, err := goredis.ParseURL(base)
	if err != nil {
		t.Fatal(err)
	}
	ts := testStream{base: base, name: "idemq-test:" + randomHex(5), rdb: goredis.NewClient(o)}
	t.Cleanup(func() {
		ts.rdb.Del(context.Background(), ts.name, ts.name+":dlq")
		ts.rdb.Close()
	})
	return ts
}

// opts open the stream's group "g" as consumer "worker" with a lease of
// 1s, polling every 50ms.
func (ts testStream) opts(t testing.TB, more ...Option) []Option {
	return append([]Option{WithGroup("g"), WithConsumer("worker"), WithMinIdle(time.Second), WithPoll(50 * time.Millisecond), WithLogger(testLogger(t))}, more...)
}

func (ts testStream) open(t testing.TB, more ...Option) *Source {
	t.Helper()
	s, err := Open(context.Background(), ts.url(""), ts.opts(t, more...)...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// url is the stream's URL with query.
func (ts testStream) url(query string) string {
	return ts.base + "/" + ts.name + "?" + query
}

// publishRaw adds msgs with go-redis alone, as the Publisher lays them
// out.
func (ts testStream) publishRaw(ctx context.Context, msgs ...*driver.Message) error {
	pipe := ts.rdb.Pipeline()
	for _, m := range msgs {
		var v []any
		for k, h := range m.Headers {
			v = append(v, k, h)
		}
		if m.ID != "" {
			v = append(v, DefaultIDField, m.ID)
		}
		if m.Key != "" {
			v = append(v, KeyField, m.Key)
		}
		pipe.XAdd(ctx, &goredis.XAddArgs{Stream: ts.name, Values: append(v, BodyField, m.Body)})
	}
	_, err := pipe.Exec(ctx)
	return err
}

// fields returns an entry's fields as strings.
func fields(x goredis.XMessage) map[string]string {
	out := map[string]string{}
	for k, v := range x.Values {
		out[k] = v.(string)
	}
	return out
}

// rawNext reads the next new entry of group "g" as consumer "raw" with
// go-redis alone and acknowledges it.
func (ts testStream) rawNext(ctx context.Context) (brokertest.RawMessage, error) {
	res, err := ts.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{Group: "g", Consumer: "raw", Streams: []string{ts.name, ">"}, Count: 1, Block: 5 * time.Second}).Result()
	if err != nil {
		return brokertest.RawMessage{}, err
	}
	x := res[0].Messages[0]
	if err := ts.rdb.XAck(ctx, ts.name, "g", x.ID).Err(); err != nil {
		return brokertest.RawMessage{}, err
	}
	f := fields(x)
	m := brokertest.RawMessage{ID: f[DefaultIDField], Key: f[KeyField], Body: []byte(f[BodyField]), Headers: f}
	return m, nil
}

// rawDeadLetters reads the dead-letter stream with go-redis alone.
func (ts testStream) rawDeadLetters(ctx context.Context) ([]brokertest.DeadLetter, error) {
	xs, err := ts.rdb.XRange(ctx, ts.name+":dlq", "-", "+").Result()
	var out []brokertest.DeadLetter
	for _, x := range xs {
		f := fields(x)
		out = append(out, brokertest.DeadLetter{ID: f[DefaultIDField], Body: []byte(f[BodyField]), Cause: f[driver.CauseHeader]})
	}
	return out, err
}

// pending returns the group's pending entries: id → delivery count.
func (ts testStream) pending(t testing.TB) map[string]int64 {
	t.Helper()
	ps, err := ts.rdb.XPendingExt(context.Background(), &goredis.XPendingExtArgs{Stream: ts.name, Group: "g", Start: "-", End: "+", Count: 1000}).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, p := range ps {
		out[p.ID] = p.RetryCount
	}
	return out
}

// refuseXClaim is a go-redis hook that fails the client's XCLAIMs while
// on: its source's heartbeats fail, as with the server away.
type refuseXClaim struct{ on *atomic.Bool }

func (h refuseXClaim) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h refuseXClaim) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if h.on.Load() && cmd.Name() == "xclaim" {
			cmd.SetErr(errors.New("test: XCLAIM refused"))
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}

func (h refuseXClaim) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// lapseLeases lets the lease of every entry src holds lapse: its
// heartbeats fail until every entry pending to its consumer has been idle
// for min_idle, so the group may reclaim them and the deliveries the
// Consumer's flow holds are stale.
func lapseLeases(t *testing.T, src driver.Source) {
	s := src.(*Source)
	var refuse atomic.Bool
	refuse.Store(true)
	defer refuse.Store(false)
	s.rdb.AddHook(refuseXClaim{&refuse})
	servicetest.WaitFor(t, s.c.minIdle+10*time.Second, "the leases to lapse", func() bool {
		ps, err := s.rdb.XPendingExt(context.Background(), &goredis.XPendingExtArgs{Stream: s.stream, Group: s.c.group, Consumer: s.c.consumer, Start: "-", End: "+", Count: 10000}).Result()
		for _, p := range ps {
			if p.Idle < s.c.minIdle {
				return false
			}
		}
		return err == nil
	})
}

// run runs a Consumer of src over e with the tests' options, then opts.
func run(t *testing.T, e *brokertest.Effects, src driver.Source, h core.Handler[*sql.Tx], opts ...core.Option) (*core.Consumer[*sql.Tx], func() error) {
	return e.Run(t, src, h, append([]core.Option{core.WithName("redis-test"), core.WithLogger(testLogger(t)), core.WithBackoff(core.ConstantBackoff(50 * time.Millisecond))}, opts...)...)
}

// server is a private redis-server on a free loopback port, in a
// temporary directory, stopped when the test ends; the machine's own
// server is never touched.
type server struct {
	t    testing.TB
	dir  string
	port int
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// startRedis starts a private server with an append-only file fsynced at
// every write, and extra arguments.
func startRedis(t testing.TB, extra ...string) *server {
	t.Helper()
	s := newRedis(t, "--port", extra...)
	s.start()
	return s
}

// newRedis prepares a private server listening on a free port given to
// portFlag (--port, or --tls-port beside --port 0).
func newRedis(t testing.TB, portFlag string, extra ...string) *server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		servicetest.Unavailable(t, "no redis-server to start a private Redis server: %v", err)
	}
	s := &server{t: t, dir: t.TempDir(), port: servicetest.FreePort(t)}
	s.args = append([]string{portFlag, strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
		"--appendfsync", "always", "--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log")}, extra...)
	t.Cleanup(func() { s.stop(syscall.SIGTERM) })
	return s
}

func (s *server) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// start starts the server and waits until it accepts connections.
func (s *server) start() {
	s.t.Helper()
	cmd := exec.Command("redis-server", s.args...)
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", s.addr(), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			s.t.Fatalf("private redis-server exited at start:\n%s", s.log())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("private redis-server did not start: %v\n%s", err, s.log())
		}
	}
}

// stop stops the server with sig (SIGKILL: a crash) and waits for it.
func (s *server) stop(sig os.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

func (s *server) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	return string(b)
}

// waitFor polls cond until it holds, failing t after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	servicetest.WaitFor(t, timeout, what, cond)
}
