package kafka

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/sqlite"
)

// bufferLogger logs as text to b.
func bufferLogger(b *servicetest.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// partitionsOf returns how many partitions topic has (0: it does not exist).
func partitionsOf(t *testing.T, bs, topic string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	td, err := adminClient(t, bs).ListTopics(ctx, topic)
	if err != nil {
		t.Fatalf("metadata %s: %v", topic, err)
	}
	if d, ok := td[topic]; ok && d.Err == nil {
		return len(d.Partitions)
	}
	return 0
}

func deleteTopic(t *testing.T, bs, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := adminClient(t, bs).DeleteTopic(ctx, topic); err != nil {
		t.Fatalf("delete %s: %v", topic, err)
	}
	servicetest.WaitFor(t, time.Minute, "the deleted topic to be gone", func() bool { return partitionsOf(t, bs, topic) == 0 })
}

// A missing dead-letter topic (and a missing retry topic) is created at
// Open like the consumed topic, so that dead letters and retry copies can
// be written instead of failing with Unknown Topic Or Partition forever.
func TestOpenCreatesMissingDeadLetterAndRetryTopics(t *testing.T) {
	bs := brokers(t)
	topic := "idemq-test-" + randomHex(5)
	createTopics(t, bs, 3, topic) // no .dlq, no .retry
	publishN(t, bs, topic, "dl", 2, nil)
	src := openSource(t, bs, topic, "g-"+randomHex(4), WithRetryTopic(topic+".retry"))
	s := brokertest.StartReceiver(t, src, 0)
	for _, name := range []string{topic + ".dlq", topic + ".retry"} {
		if n := partitionsOf(t, bs, name); n != 3 {
			t.Errorf("after Open %s has %d partitions, want 3 (the consumed topic's)", name, n)
		}
	}
	ds := receiveN(t, s, 2, 10*time.Second)
	ctx := context.Background()
	if err := ds[0].DeadLetter(ctx, errors.New("poison")); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	if err := ds[1].Retry(ctx, 0); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	dls := readAll(t, bs, topic+".dlq")
	if len(dls) != 1 || dls[0].headers[DefaultIDHeader] != ds[0].Message().ID || dls[0].headers[driver.CauseHeader] != "poison" {
		t.Fatalf("dead letters %+v, want %q with cause poison", dls, ds[0].Message().ID)
	}
	again := receiveN(t, s, 1, 10*time.Second)[0]
	if again.Message().ID != ds[1].Message().ID || again.Message().Source != topic {
		t.Fatalf("after Retry got %q from %q, want %q", again.Message().ID, again.Message().Source, ds[1].Message().ID)
	}
	_ = again.Ack(ctx)
}

// When the cluster refuses to create the missing dead-letter or retry
// topic, Open fails naming the setting: the option when opened with
// options, the URL parameter when opened by URL. (Kafka, and kfake,
// refuse a topic whose name differs from an existing one only in '.'
// versus '_'.)
func TestOpenRefusesUncreatableTopicsNamingTheSetting(t *testing.T) {
	bs := brokers(t)
	topic := "idemq-test-" + randomHex(5)
	createTopics(t, bs, 2, topic, topic+"_dlq", topic+"_retry")
	group := "g-" + randomHex(4)
	ctx := context.Background()
	cases := []struct {
		name string
		open func() (driver.Source, error)
		want string
	}{
		{"dead-letter topic, options", func() (driver.Source, error) {
			return Open(ctx, bs, WithTopic(topic), WithGroup(group))
		}, "WithDeadLetterTopic"},
		{"dead-letter topic, URL", func() (driver.Source, error) {
			return core.OpenSource(ctx, fmt.Sprintf("kafka://%s/%s?group=%s", bs, topic, group))
		}, "dead_letter_topic"},
		{"retry topic, options", func() (driver.Source, error) {
			return Open(ctx, bs, WithTopic(topic), WithGroup(group), WithDeadLetterTopic(topic+"_dlq"), WithRetryTopic(topic+".retry"))
		}, "WithRetryTopic"},
		{"retry topic, URL", func() (driver.Source, error) {
			return core.OpenSource(ctx, fmt.Sprintf("kafka://%s/%s?group=%s&dead_letter_topic=%s_dlq&retry_topic=%s.retry", bs, topic, group, topic, topic))
		}, "retry_topic"},
	}
	for _, c := range cases {
		s, err := c.open()
		if err == nil {
			s.Close()
			t.Errorf("%s: Open succeeded, want a refusal naming %s", c.name, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%s: %v; want it to name %s and say the cluster refused", c.name, err, c.want)
		}
		t.Logf("%s: %v", c.name, err)
	}
	if n := partitionsOf(t, bs, topic+".dlq"); n != 0 {
		t.Errorf("%s.dlq exists with %d partitions", topic, n)
	}
}

// When the dead-letter topic disappears after Open, DeadLetter tries a
// bounded number of times, then returns the error without dropping the
// message: it is handed out again, and other keys go on meanwhile. The
// warning goes to the logger given with core.WithAdapterLogger.
func TestDeadLetterToDeletedTopicIsRedeliveredNotDropped(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	msgs := publishN(t, bs, topic, "gone", 2, func(i int) string { return fmt.Sprintf("key-%d", i) })
	logs := &servicetest.Buffer{}
	ctx := context.Background()
	u := fmt.Sprintf("kafka://%s/%s?group=g-%s&session_timeout=2s&heartbeat_interval=50ms&rebalance_timeout=4s&revoke_timeout=2s", bs, topic, randomHex(4))
	cs, err := core.OpenSource(ctx, u, core.WithAdapterLogger(bufferLogger(logs)))
	if err != nil {
		t.Fatal(err)
	}
	s := brokertest.StartReceiver(t, cs, 0)
	first := receiveN(t, s, 1, 10*time.Second)[0]
	if first.Message().ID != msgs[0].ID {
		t.Fatalf("got %q first, want %q", first.Message().ID, msgs[0].ID)
	}
	deleteTopic(t, bs, topic+".dlq")
	err = first.DeadLetter(ctx, errors.New("poison"))
	if err == nil || errors.Is(err, core.ErrStaleDelivery) {
		t.Fatalf("DeadLetter to a deleted topic = %v, want a failure", err)
	}
	t.Logf("DeadLetter: %v", err)
	// The other key is not held up, and the failed message comes back.
	got := map[string]*brokertest.Delivery{}
	for _, d := range receiveN(t, s, 2, 10*time.Second) {
		got[d.Message().ID] = d
	}
	if got[msgs[1].ID] == nil || got[msgs[0].ID] == nil {
		t.Fatalf("after the failed DeadLetter got %v, want both messages", got)
	}
	if a := got[msgs[0].ID].Message().Attempt; a < 2 {
		t.Errorf("redelivered with attempt %d, want 2 or more", a)
	}
	for _, d := range got {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(logs.String(), "producing a copy failed") {
		t.Errorf("the adapter's warning did not reach the adapter logger; it logged:\n%s", logs.String())
	}
}

// A Source given no logger of its own logs to the Consumer's logger
// (core.WithLogger), through SetLogger.
func TestConsumerLoggerReachesAdapterWarnings(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	publishN(t, bs, topic, "poison", 1, nil)
	all := fastGroup(t)[:3] // fastGroup without its WithLogger
	s, err := Open(context.Background(), bs, append(all, WithTopic(topic), WithGroup("g-"+randomHex(4)))...)
	if err != nil {
		t.Fatal(err)
	}
	deleteTopic(t, bs, topic+".dlq")
	store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "dedup.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	logs := &servicetest.Buffer{}
	c, err := core.New[*sql.Tx](s, store, func(context.Context, *sql.Tx, *core.Message) error {
		return core.Permanent(errors.New("poison"))
	}, core.WithName("logger-test"), core.WithLogger(bufferLogger(logs)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	servicetest.WaitFor(t, time.Minute, "the adapter's warning in the Consumer's log", func() bool {
		return strings.Contains(logs.String(), "idemq kafka: producing a copy failed")
	})
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
