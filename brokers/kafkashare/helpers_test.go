package kafkashare

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// testLock is the record lock the tests' clusters give share groups: long
// enough for a batch, short enough that a lapse fits in a test.
const testLock = 2 * time.Second

// cluster starts a kfake cluster (bench/cmd/kfake, a process of its own)
// with share groups locking records for testLock, sweeping lapsed locks
// every 100ms, and archiving a record after limit deliveries; it returns
// the brokers. IDEMQ_KAFKA_URL is not used: a real cluster's share-group
// settings are not the tests' to change.
func cluster(t testing.TB, limit int) string {
	t.Helper()
	if os.Getenv(servicetest.KafkaEnv) != "" {
		t.Logf("%s is set; share-group tests run on kfake all the same (they set the cluster's lock and delivery limit)", servicetest.KafkaEnv)
	}
	return servicetest.StartKfake(t, "-brokers", "1", "-auto-create=false",
		"-config", "group.share.record.lock.duration.ms="+strconv.Itoa(int(testLock/time.Millisecond)),
		"-config", "share.record.lock.sweep.interval.ms=100",
		"-config", "group.share.delivery.count.limit="+strconv.Itoa(limit),
		"-config", "group.share.heartbeat.interval.ms=200",
		"-config", "group.share.session.timeout.ms=3000")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newTopic creates a uniquely named topic of partitions partitions and its
// one-partition dead-letter topic.
func newTopic(t testing.TB, bs string, partitions int32) string {
	t.Helper()
	topic := "share-" + randomHex(5)
	cl := client(t, bs)
	req := kmsg.NewPtrCreateTopicsRequest()
	for name, n := range map[string]int32{topic: partitions, topic + ".dlq": 1} {
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, n, 1
		req.Topics = append(req.Topics, rt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("create topics: %v", err)
	}
	for _, rt := range resp.Topics {
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil {
			t.Fatalf("create topic %s: %v", rt.Topic, err)
		}
	}
	return topic
}

// client is a plain franz-go client of bs, closed when t ends.
func client(t testing.TB, bs string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(bs, ",")...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// produce writes msgs to topic with franz-go, the id in the message-id
// header (none when empty).
func produce(t testing.TB, bs, topic string, msgs ...*driver.Message) {
	t.Helper()
	cl := client(t, bs)
	var rs []*kgo.Record
	for _, m := range msgs {
		r := &kgo.Record{Topic: topic, Key: []byte(m.Key), Value: m.Body}
		if m.ID != "" {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "message-id", Value: []byte(m.ID)})
		}
		for k, v := range m.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		rs = append(rs, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// sourceURL is the kafka+share:// URL of topic in group.
func sourceURL(bs, topic, group, params string) string {
	u := "kafka+share://" + bs + "/" + topic + "?group=" + group
	if params != "" {
		u += "&" + params
	}
	return u
}

// open opens a Source, closed when t ends.
func open(t testing.TB, url string, opts ...Option) *Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := Open(ctx, url, opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
