package kafka

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// brokers returns the broker list to test against: IDEMQ_KAFKA_URL when
// set (a real cluster; unreachable skips, or fails with
// IDEMQ_REQUIRE_SERVICES=1), else a fresh kfake cluster (bench/cmd/kfake,
// in a process of its own: servicetest.StartKfake) that speaks the Kafka
// wire protocol on a loopback port and is stopped when the test ends. Like
// a Kafka broker's default, it creates no topic on first use; its groups
// accept session timeouts down to 100ms, and KIP-848 groups heartbeat
// every 100ms and time out after 2s.
func brokers(t testing.TB) string {
	t.Helper()
	if url := os.Getenv(servicetest.KafkaEnv); url != "" {
		cfg := defaultConfig()
		if _, err := parseTarget(url, &cfg, nil); err != nil {
			t.Fatalf("%s: %v", servicetest.KafkaEnv, err)
		}
		bs := strings.Join(cfg.brokers, ",")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := adminClient(t, bs).BrokerMetadata(ctx); err != nil {
			servicetest.Unavailable(t, "Kafka unreachable at %s=%s: %v", servicetest.KafkaEnv, url, err)
		}
		return bs
	}
	return servicetest.StartKfake(t, kfakeArgs()...)
}

// kfakeArgs are the flags of the tests' kfake clusters (see brokers).
func kfakeArgs(more ...string) []string {
	return append([]string{"-brokers", "1", "-auto-create=false", "-min-session-timeout", "100ms",
		"-config", "group.consumer.heartbeat.interval.ms=100", "-config", "group.consumer.session.timeout.ms=2000"}, more...)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// adminClient is an admin client of bs, closed when the test ends.
func adminClient(t testing.TB, bs string, opts ...kgo.Opt) *kadm.Client {
	t.Helper()
	return kadm.NewClient(client(t, bs, opts...))
}

// client is a franz-go client of bs, closed when the test ends.
func client(t testing.TB, bs string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(bs, ",")...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
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
	adm := adminClient(t, bs)
	resp, err := adm.CreateTopics(ctx, int32(partitions), 1, nil, names...)
	if err != nil {
		t.Fatalf("create topics %v: %v", names, err)
	}
	for _, r := range resp {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			t.Fatalf("create topic %s: %v", r.Topic, r.Err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, names...)
	})
}

// fastGroup are Source options that make rebalances quick enough for
// tests: heartbeats every 50ms, a 2s session (6s on IDEMQ_KAFKA_URL, the
// usual broker minimum), quick commits.
func fastGroup(t testing.TB) []Option {
	session := 2 * time.Second
	if os.Getenv(servicetest.KafkaEnv) != "" {
		session = 6 * time.Second // Kafka's default group.min.session.timeout.ms
	}
	return []Option{
		WithGroupTimeouts(session, 50*time.Millisecond, 4*time.Second),
		WithRevokeTimeout(2 * time.Second),
		WithCommit(50*time.Millisecond, 100),
		WithLogger(testLogger(t)),
	}
}

// record is one message read back from a topic.
type record struct {
	partition int32
	offset    int64
	key       string
	value     []byte
	headers   map[string]string
}

// readAll reads every message of every partition of topic without a
// consumer group.
func readAll(t testing.TB, bs, topic string) []record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adminClient(t, bs).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	left := 0
	ends.Each(func(o kadm.ListedOffset) { left += int(o.Offset) })
	cl := client(t, bs, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	var out []record
	for left > len(out) {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records of %s: %v", len(out), left, topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			rec := record{partition: r.Partition, offset: r.Offset, key: string(r.Key), value: r.Value, headers: map[string]string{}}
			for _, h := range r.Headers {
				rec.headers[h.Key] = string(h.Value)
			}
			out = append(out, rec)
		})
	}
	return out
}

// committed returns the group's committed offsets of topic's partitions
// 0..n-1 (-1 where none).
func committed(t testing.TB, bs, group, topic string, n int) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := adminClient(t, bs).FetchOffsets(ctx, group)
	if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		t.Fatalf("offset fetch: %v", err)
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = -1
		if o, ok := resp.Lookup(topic, int32(i)); ok && o.Err == nil {
			out[i] = o.At
		}
	}
	return out
}

// endOffsets returns the end offsets of topic's partitions 0..n-1.
func endOffsets(t testing.TB, bs, topic string, n int) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ends, err := adminClient(t, bs).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	out := make([]int64, n)
	for i := range out {
		o, _ := ends.Lookup(topic, int32(i))
		out[i] = o.Offset
	}
	return out
}

// drained reports whether the group committed every partition of topic up
// to its end.
func drained(t testing.TB, bs, group, topic string, n int) bool {
	ends := endOffsets(t, bs, topic, n)
	got := committed(t, bs, group, topic, n)
	for i := range ends {
		if got[i] != ends[i] {
			return false
		}
	}
	return true
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

// option makes a client dial through c.
func (c *cutter) option() PublisherOption {
	return WithClientOptions(kgo.Dialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.dead {
			return nil, errors.New("test: this consumer was killed")
		}
		conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		if err == nil {
			c.conns = append(c.conns, conn)
		}
		return conn, err
	}))
}

// revive lets new connections through again.
func (c *cutter) revive() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dead = false
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

func publishN(t testing.TB, bs, topic, prefix string, n int, key func(i int) string) []*driver.Message {
	t.Helper()
	pub, err := NewPublisher(context.Background(), bs)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	msgs := make([]*driver.Message, n)
	for i := range msgs {
		msgs[i] = &driver.Message{ID: fmt.Sprintf("%s-%04d", prefix, i), Body: fmt.Appendf(nil, `{"n":%d}`, i)}
		if key != nil {
			msgs[i].Key = key(i)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, topic, msgs...); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// openSource opens a Source of topic in group with fastGroup's options and
// opts, closed when the test ends.
func openSource(t testing.TB, bs, topic, group string, opts ...Option) *Source {
	t.Helper()
	all := append(fastGroup(t), WithTopic(topic), WithGroup(group))
	s, err := Open(context.Background(), bs, append(all, opts...)...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// startSource opens a Source (see openSource) and drives it as a Consumer
// does, a message at a time, with a window of n (0: the default).
func startSource(t *testing.T, bs, topic, group string, window int, opts ...Option) (*Source, *brokertest.Receiver) {
	t.Helper()
	s := openSource(t, bs, topic, group, opts...)
	return s, brokertest.StartReceiver(t, s, window)
}

// receiveN receives n messages or fails the test after timeout.
func receiveN(t testing.TB, r *brokertest.Receiver, n int, timeout time.Duration) []*brokertest.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out := make([]*brokertest.Delivery, 0, n)
	for len(out) < n {
		d, err := r.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("received %d of %d messages within %v", len(out), n, timeout)
			}
			t.Logf("receive: %v", err)
			continue
		}
		out = append(out, d)
	}
	return out
}

// expectNothing fails if r hands out anything within d.
func expectNothing(t testing.TB, r *brokertest.Receiver, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if dl, err := r.Receive(ctx); err == nil {
		m := dl.Message()
		md := driver.MetadataOf(m.Metadata)
		t.Fatalf("unexpected delivery %q (%s/%s@%s)", m.ID, m.Source, md["messaging.destination.partition.id"], md["messaging.kafka.offset"])
	}
}

// entryOf is the entry a delivery was handed out from.
func entryOf(d *brokertest.Delivery) *entry { return d.Message().AckID.(*entry) }
