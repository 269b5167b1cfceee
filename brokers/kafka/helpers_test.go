package kafka

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/servicetest"
)

// brokers returns the broker list to test against: IDEMQ_KAFKA_URL when
// set (a real cluster; unreachable skips, or fails with
// IDEMQ_REQUIRE_SERVICES=1), else a fresh kfake cluster (bench/cmd/kfake,
// in a process of its own: servicetest.StartKfake) that speaks the Kafka
// wire protocol on a loopback port and is stopped when the test ends. Like
// a Kafka broker's default, it creates no topic on first use; its groups
// accept session timeouts down to 100ms.
func brokers(t testing.TB) string {
	t.Helper()
	if url := os.Getenv("IDEMQ_KAFKA_URL"); url != "" {
		cfg := defaultConfig()
		if _, err := parseTarget(url, &cfg); err != nil {
			t.Fatalf("IDEMQ_KAFKA_URL: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c := &kafkago.Client{Addr: kafkago.TCP(cfg.brokers...)}
		if _, err := c.Metadata(ctx, &kafkago.MetadataRequest{}); err != nil {
			servicetest.Unavailable(t, "Kafka unreachable at IDEMQ_KAFKA_URL=%s: %v", url, err)
		}
		return strings.Join(cfg.brokers, ",")
	}
	return servicetest.StartKfake(t, "-brokers", "1", "-auto-create=false", "-min-session-timeout", "100ms")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newTopic creates a uniquely named topic with partitions partitions and
// its one-partition dead-letter topic, and returns its name.
func newTopic(t testing.TB, bs string, partitions int) string {
	t.Helper()
	topic := "idemq-test-" + randomHex(5)
	createTopics(t, bs, partitions, topic)
	createTopics(t, bs, 1, topic+".dlq")
	return topic
}

func createTopics(t testing.TB, bs string, partitions int, names ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := adminClient(bs)
	var cfgs []kafkago.TopicConfig
	for _, n := range names {
		cfgs = append(cfgs, kafkago.TopicConfig{Topic: n, NumPartitions: partitions, ReplicationFactor: 1})
	}
	resp, err := c.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: cfgs})
	if err != nil {
		t.Fatalf("create topics %v: %v", names, err)
	}
	for n, err := range resp.Errors {
		if err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
			t.Fatalf("create topic %s: %v", n, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = c.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: names})
	})
}

// fastGroup are Source options that make rebalances quick enough for
// tests: heartbeats every 50ms, a 2s session (6s on IDEMQ_KAFKA_URL, the
// usual broker minimum), quick commits.
func fastGroup(t testing.TB) []Option {
	session := 2 * time.Second
	if os.Getenv("IDEMQ_KAFKA_URL") != "" {
		session = 6 * time.Second // Kafka's default group.min.session.timeout.ms
	}
	return []Option{
		WithGroupTimeouts(session, 50*time.Millisecond, 4*time.Second),
		WithRevokeTimeout(2 * time.Second),
		WithJoinBackoff(100 * time.Millisecond),
		WithCommit(50*time.Millisecond, 100),
		WithLogger(testLogger(t)),
	}
}

// record is one message read back from a topic.
type record struct {
	partition int
	offset    int64
	key       string
	value     []byte
	headers   map[string]string
}

// readAll reads every message of every partition of topic (partitions
// 0..n-1) without a consumer group.
func readAll(t testing.TB, bs, topic string, n int) []record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := adminClient(bs)
	var out []record
	for p := 0; p < n; p++ {
		offset := int64(0)
		for {
			resp, err := c.Fetch(ctx, &kafkago.FetchRequest{Topic: topic, Partition: p, Offset: offset, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 10 * time.Millisecond})
			if err != nil {
				t.Fatalf("fetch %s/%d: %v", topic, p, err)
			}
			if resp.Error != nil {
				t.Fatalf("fetch %s/%d: %v", topic, p, resp.Error)
			}
			got := 0
			for {
				r, err := resp.Records.ReadRecord()
				if err != nil {
					break
				}
				rec := record{partition: p, offset: r.Offset, headers: map[string]string{}}
				if r.Key != nil {
					k, _ := io.ReadAll(r.Key)
					rec.key = string(k)
				}
				if r.Value != nil {
					rec.value, _ = io.ReadAll(r.Value)
				}
				for _, h := range r.Headers {
					rec.headers[h.Key] = string(h.Value)
				}
				if r.Offset >= offset {
					out = append(out, rec)
					offset = r.Offset + 1
					got++
				}
			}
			if got == 0 || offset >= resp.HighWatermark {
				break
			}
		}
	}
	return out
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// cutter is a dialer whose connections the test can cut, and whose later
// dials fail: the process it belongs to is gone, as after kill -9.
type cutter struct {
	mu    sync.Mutex
	conns []net.Conn
	dead  bool
}

func (c *cutter) dialer() *kafkago.Dialer {
	return &kafkago.Dialer{
		Timeout: 5 * time.Second,
		DialFunc: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c.mu.Lock()
			dead := c.dead
			c.mu.Unlock()
			if dead {
				return nil, errors.New("test: this consumer was killed")
			}
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.dead {
				conn.Close()
				return nil, errors.New("test: this consumer was killed")
			}
			c.conns = append(c.conns, conn)
			return conn, nil
		},
	}
}

// kill cuts every connection and refuses new ones.
func (c *cutter) kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dead = true
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}

// adminClient is a kafka-go client for bs with a transport of its own:
// clients without one share kafka-go's DefaultTransport, whose metadata
// cache (6s) would hide a topic that the Source created meanwhile.
func adminClient(bs string) *kafkago.Client {
	return &kafkago.Client{Addr: kafkago.TCP(strings.Split(bs, ",")...), Transport: &kafkago.Transport{}}
}
