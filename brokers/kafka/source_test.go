package kafka

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	kafkago "github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
)

// receiveN receives n deliveries or fails the test after timeout.
func receiveN(t testing.TB, s *Source, n int, timeout time.Duration) []*delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out := make([]*delivery, 0, n)
	for len(out) < n {
		d, err := s.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("received %d of %d deliveries within %v", len(out), n, timeout)
			}
			t.Logf("receive: %v", err)
			continue
		}
		out = append(out, d.(*delivery))
	}
	return out
}

// expectNothing fails if s hands out anything within d.
func expectNothing(t testing.TB, s *Source, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if dl, err := s.Receive(ctx); err == nil {
		m := dl.Message()
		t.Fatalf("unexpected delivery %q (%s/%s@%s)", m.ID, m.Source, driver.MetadataOf(m.Metadata)["messaging.destination.partition.id"], driver.MetadataOf(m.Metadata)["messaging.kafka.offset"])
	}
}

// committed returns the group's committed offsets of topic's partitions
// 0..n-1 (-1 where none).
func committed(t testing.TB, bs, group, topic string, n int) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := &kafkago.Client{Addr: kafkago.TCP(strings.Split(bs, ",")...)}
	ps := make([]int, n)
	for i := range ps {
		ps[i] = i
	}
	resp, err := c.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ps}})
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = -1
	}
	for _, p := range resp.Topics[topic] {
		out[p.Partition] = p.CommittedOffset
	}
	return out
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, topic, msgs...); err != nil {
		t.Fatal(err)
	}
	return msgs
}

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

func offsetOf(d driver.Delivery) int64 {
	o, _ := strconv.ParseInt(driver.MetadataOf(d.Message().Metadata)["messaging.kafka.offset"], 10, 64)
	return o
}

// Out-of-order completion: messages of one partition are acked in a
// random order, and after every ack the committed offset, once the commit
// happened, is never past the lowest message still undecided.
func TestOutOfOrderAcksNeverCommitPastUndecided(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	group := "g-" + randomHex(4)
	const n = 40
	publishN(t, bs, topic, "ooo", n, nil)
	s := openSource(t, bs, topic, group, WithOrdering(OrderNone), WithCommit(time.Hour, 1))
	ds := receiveN(t, s, n, 10*time.Second)
	order := rand.Perm(n)
	undecided := make(map[int64]bool, n)
	for _, d := range ds {
		undecided[offsetOf(d)] = true
	}
	lowest := func() int64 {
		low := int64(n)
		for o := range undecided {
			low = min(low, o)
		}
		return low
	}
	for k, i := range order {
		before := s.Stats().Commits
		if err := ds[i].Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
		delete(undecided, offsetOf(ds[i]))
		// WithCommit(_, 1): every decision triggers a commit; wait for it.
		deadline := time.Now().Add(2 * time.Second)
		for s.Stats().Commits == before && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		got := committed(t, bs, group, topic, 1)[0]
		if got > lowest() {
			t.Fatalf("after %d acks the committed offset is %d, past undecided offset %d", k+1, got, lowest())
		}
		if got < lowest() && s.Stats().Commits > before {
			// A commit after this ack must carry the whole decided prefix.
			t.Fatalf("after %d acks the committed offset is %d, want the decided prefix %d", k+1, got, lowest())
		}
	}
	if got := committed(t, bs, group, topic, 1)[0]; got != n {
		t.Fatalf("committed %d after every ack, want %d", got, n)
	}
}

// Retry in place holds the partition (OrderPerPartition) and the commit
// point, while another partition goes on.
func TestRetryInPlaceHoldsPartitionNotOthers(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 2)
	group := "g-" + randomHex(4)
	// Keys that land on different partitions: find two by publishing and
	// reading their partitions back.
	publishN(t, bs, topic, "rip", 20, func(i int) string { return "k" + strconv.Itoa(i%4) })
	s := openSource(t, bs, topic, group, WithOrdering(OrderPerPartition))
	if err := s.SetWindow(10); err != nil {
		t.Fatal(err)
	}
	first := receiveN(t, s, 2, 10*time.Second) // one per partition: the partition waits for its in-flight one
	if first[0].e.p == first[1].e.p {
		t.Fatalf("OrderPerPartition handed out two messages of partition %d at once", first[0].e.msg.Partition)
	}
	held, other := first[0], first[1]
	heldPart := held.e.msg.Partition
	start := time.Now()
	if err := held.Retry(context.Background(), 400*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// The other partition goes on while the held one waits.
	if err := other.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	for {
		d := receiveN(t, s, 1, 5*time.Second)[0]
		if d.e.msg.Partition == heldPart {
			if d.Message().ID != held.Message().ID {
				t.Fatalf("partition %d skipped ahead to %q while %q was waiting for its retry", heldPart, d.Message().ID, held.Message().ID)
			}
			if time.Since(start) < 400*time.Millisecond {
				t.Fatalf("retried after %v, before its delay", time.Since(start))
			}
			if d.Message().Attempt != 2 {
				t.Fatalf("retry Attempt = %d, want 2", d.Message().Attempt)
			}
			if c := committed(t, bs, group, topic, 2)[heldPart]; c > held.e.msg.Offset {
				t.Fatalf("committed %d on partition %d past the retried offset %d", c, heldPart, held.e.msg.Offset)
			}
			break
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// WithRetryTopic: Retry produces a copy to the retry topic and marks the
// original done; the copy comes back after the delay with Attempt 2.
func TestRetryTopic(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	createTopics(t, bs, 1, topic+".retry")
	group := "g-" + randomHex(4)
	msgs := publishN(t, bs, topic, "rt", 3, nil)
	s := openSource(t, bs, topic, group, WithRetryTopic(topic+".retry"))
	ds := receiveN(t, s, 3, 10*time.Second)
	var retried *delivery
	for _, d := range ds {
		if d.Message().ID == msgs[1].ID {
			retried = d
			continue
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := retried.Retry(context.Background(), 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	again := receiveN(t, s, 1, 10*time.Second)[0]
	m := again.Message()
	if m.ID != msgs[1].ID || string(m.Body) != string(msgs[1].Body) {
		t.Fatalf("got %q %q back, want %q", m.ID, m.Body, msgs[1].ID)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Errorf("copy processed after %v, before its delay", time.Since(start))
	}
	if m.Attempt != 2 || driver.MetadataOf(m.Metadata)["messaging.destination.name"] != topic+".retry" || m.Source != topic {
		t.Errorf("copy: Attempt %d, destination %q, Source %q", m.Attempt, driver.MetadataOf(m.Metadata)["messaging.destination.name"], m.Source)
	}
	if got, want := m.Headers[driver.OriginHeader], topic+"/"+strconv.Itoa(retried.e.msg.Partition)+"/"+strconv.FormatInt(retried.e.msg.Offset, 10); got != want {
		t.Errorf("copy's origin header %q, want %s", got, want)
	}
	// The original was marked done: the main topic commits past it.
	servicetest.WaitFor(t, 5*time.Second, "the main topic committed past the retried message", func() bool {
		return committed(t, bs, group, topic, 1)[0] == 3
	})
	if err := again.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	servicetest.WaitFor(t, 5*time.Second, "the retry topic committed", func() bool {
		return committed(t, bs, group, topic+".retry", 1)[0] == 1
	})
}

// A dead-letter write that fails keeps the message: it comes back. (Open
// creates a missing dead-letter topic, so here it goes missing later.)
func TestDeadLetterTopicMissingKeepsMessage(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	group := "g-" + randomHex(4)
	publishN(t, bs, topic, "dlm", 1, nil)
	s := openSource(t, bs, topic, group)
	deleteTopic(t, bs, topic+".dlq")
	d := receiveN(t, s, 1, 10*time.Second)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.DeadLetter(ctx, errors.New("poison")); err == nil {
		t.Fatal("DeadLetter to a missing topic returned nil")
	}
	again := receiveN(t, s, 1, 10*time.Second)[0]
	if again.Message().ID != d.Message().ID || again.Message().Attempt != 2 {
		t.Fatalf("got %q attempt %d back, want %q attempt 2", again.Message().ID, again.Message().Attempt, d.Message().ID)
	}
	if c := committed(t, bs, group, topic, 1)[0]; c > 0 {
		t.Fatalf("committed %d past a message whose dead letter was not written", c)
	}
}

// The message's fields: id from the header (or a configured one), key,
// headers, metadata for tracing.
func TestMessageFields(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	pub, err := NewPublisher(context.Background(), bs)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	if err := pub.Publish(ctx, topic,
		&driver.Message{ID: "id-1", Key: "acct-7", Body: []byte("b1"), Headers: map[string]string{"ce_id": "ce-1", "x": "y"}},
		&driver.Message{Key: "acct-7", Body: []byte("b2"), Headers: map[string]string{"ce_id": "ce-2"}}); err != nil {
		t.Fatal(err)
	}
	group := "g-" + randomHex(4)
	s := openSource(t, bs, topic, group)
	ds := receiveN(t, s, 1, 10*time.Second)
	m := ds[0].Message()
	if m.ID != "id-1" || m.Key != "acct-7" || string(m.Body) != "b1" || m.Headers["x"] != "y" || m.System != "kafka" || m.Source != topic || m.Attempt != 1 {
		t.Errorf("message %+v", m)
	}
	if tp := m.Headers["traceparent"]; !strings.Contains(tp, "4bf92f3577b34da6a3ce929d0e0e4736") {
		t.Errorf("traceparent header %q does not carry the publisher's trace", tp)
	}
	want := map[string]string{
		"messaging.destination.partition.id": "0",
		"messaging.kafka.offset":             "0",
		"messaging.consumer.group.name":      group,
		"messaging.destination.name":         topic,
	}
	for k, v := range want {
		if driver.MetadataOf(m.Metadata)[k] != v {
			t.Errorf("Metadata[%s] = %q, want %q", k, driver.MetadataOf(m.Metadata)[k], v)
		}
	}
	// Same key: the second waits until the first is settled.
	expectNothing(t, s, 300*time.Millisecond)
	if err := ds[0].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	m2 := receiveN(t, s, 1, 10*time.Second)[0].Message()
	if m2.ID != "" {
		t.Errorf("a message published without an id has ID %q", m2.ID)
	}
	s.Close()

	// CloudEvents' ce_id as the id header, read by a new group.
	s2 := openSource(t, bs, topic, "g-"+randomHex(4), WithIDHeader("ce_id"))
	got := receiveN(t, s2, 1, 10*time.Second)[0].Message()
	if got.ID != "ce-1" {
		t.Errorf("WithIDHeader(ce_id): ID %q, want ce-1", got.ID)
	}
}

// RedeliveryHorizon reads the topic's retention.ms.
func TestRedeliveryHorizon(t *testing.T) {
	bs := brokers(t)
	topic := "idemq-test-" + randomHex(5)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := &kafkago.Client{Addr: kafkago.TCP(strings.Split(bs, ",")...)}
	resp, err := c.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafkago.ConfigEntry{{ConfigName: "retention.ms", ConfigValue: "3600000"}},
	}}})
	if err != nil || resp.Errors[topic] != nil {
		t.Fatalf("create: %v %v", err, resp.Errors)
	}
	s := openSource(t, bs, topic, "g-"+randomHex(4))
	h, ok := s.RedeliveryHorizon(ctx)
	if !ok || h != time.Hour {
		t.Fatalf("RedeliveryHorizon = %v, %v; want 1h, true", h, ok)
	}
}

func TestOptionErrorsNameTheField(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		target string
		opts   []Option
		want   string
	}{
		{"", nil, "brokers"},
		{"kafka://", nil, "brokers"},
		{"http://h:1/t?group=g", nil, "scheme"},
		{"h:1", []Option{WithGroup("g")}, "topic"},
		{"h:1", []Option{WithTopic("t")}, "group"},
		{"kafka://h:1/t?group=g&x=1", nil, `unknown parameter "x"`},
		{"kafka://h:1/bad topic?group=g", nil, "topic"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithOrdering(9)}, "WithOrdering"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithCommit(0, 1)}, "WithCommit"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithCommit(time.Second, 0)}, "WithCommit"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithRevokeTimeout(-1)}, "WithRevokeTimeout"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithRevokeTimeout(time.Minute)}, "WithRevokeTimeout"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithGroupTimeouts(time.Second, 2*time.Second, time.Second)}, "WithGroupTimeouts"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithStartOffset(5)}, "WithStartOffset"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithIDHeader("")}, "WithIDHeader"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithPartitionBuffer(0)}, "WithPartitionBuffer"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithDialer(nil)}, "WithDialer"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithLogger(nil)}, "WithLogger"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithRetryTopic("t")}, "WithRetryTopic"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithDeadLetterTopic("a/b")}, "WithDeadLetterTopic"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithJoinBackoff(0)}, "WithJoinBackoff"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithBatchTimeout(0)}, "WithBatchTimeout"},
		{"h:1", []Option{WithTopic("t"), WithGroup("")}, "WithGroup"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithGroupBalancers()}, "WithGroupBalancers"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithTLS(nil)}, "WithTLS"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithSASL(nil)}, "WithSASL"},
		{"kafka://u:pw@h:1/t?group=g", nil, "sasl parameter"},
		{"kafka://h:1/t?group=g&sasl=plain", nil, "URL parameter sasl: needs a user name and password"},
		{"kafka://u@h:1/t?group=g&sasl=plain", nil, "URL parameter sasl: needs a user name and password"},
		{"kafka://u:pw@h:1/t?group=g&sasl=gssapi", nil, "URL parameter sasl: not plain"},
		{"kafka://h:1/t?group=g&tls=maybe", nil, "URL parameter tls"},
		{"kafka://h:1/t?group=g&ca_file=/x.pem", nil, "URL parameter ca_file: needs tls=true"},
		{"kafka://h:1/t?group=g&tls=true&ca_file=/no/such.pem", nil, "URL parameter ca_file"},
		{"kafka://h:1/t?group=g&tls=true&cert_file=/x.pem", nil, "cert_file and key_file"},
	}
	for _, c := range cases {
		_, err := Open(ctx, c.target, c.opts...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%q, ...) = %v, want an error naming %q", c.target, err, c.want)
		}
	}
	if _, err := Open(ctx, "kafka://127.0.0.1:1/t?group=g&session_timeout=1s&heartbeat_interval=2s"); err == nil || !strings.Contains(err.Error(), "WithGroupTimeouts") {
		t.Errorf("heartbeat longer than the session: %v, want an error naming WithGroupTimeouts", err)
	}
	if _, err := NewPublisher(ctx, "", nil); err == nil {
		t.Error("NewPublisher(\"\") = nil error")
	}
	cfg := defaultConfig()
	uopts, err := parseTarget("kafka://a:1,b:2/payments?group=billing&ordering=none&commit_count=7&start=last&revoke_timeout=3s&id_header=ce_id&dead_letter_topic=dl&dead_letter_group=ops&retry_topic=rt&session_timeout=8s&heartbeat_interval=1s", &cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range uopts {
		if err := o.apply(&cfg); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.topic != "payments" || cfg.group != "billing" || len(cfg.brokers) != 2 || cfg.ordering != OrderNone || cfg.commitCount != 7 ||
		cfg.commitInterval != time.Second || cfg.startOffset != kafkago.LastOffset || cfg.revokeTimeout != 3*time.Second ||
		cfg.idHeader != "ce_id" || cfg.deadLetterTopic != "dl" || cfg.deadLetterGroup != "ops" || cfg.retryTopic != "rt" ||
		cfg.sessionTimeout != 8*time.Second || cfg.heartbeatInterval != time.Second || cfg.rebalanceTimeout != 30*time.Second {
		t.Errorf("parseTarget: %+v", cfg)
	}
	for _, bad := range []string{"kafka://h:1/t?ordering=random", "kafka://h:1/t?start=middle", "kafka://h:1/t?commit_interval=soon", "kafka://h:1/t?group=a&group=b"} {
		if _, err := parseTarget(bad, &cfg); err == nil || !strings.Contains(err.Error(), "URL parameter") {
			t.Errorf("parseTarget(%q) = %v, want an error naming the parameter", bad, err)
		}
	}
}

func TestProgressMetadataRoundTrip(t *testing.T) {
	spans := []span{{12, 3}, {20, 1}, {30, 100}}
	md := encodeProgress(10, 140, spans)
	high, got, err := decodeProgress(10, md)
	if err != nil || high != 140 || len(got) != 3 || got[0] != spans[0] || got[2] != spans[2] {
		t.Fatalf("decode(%q) = %d %v %v", md, high, got, err)
	}
	if !covered(got, 13) || covered(got, 15) || !covered(got, 129) || covered(got, 130) {
		t.Errorf("covered wrong for %v", got)
	}
	// Too many spans: cut short, never over the metadata limit.
	var many []span
	for i := int64(0); i < 5000; i++ {
		many = append(many, span{100 + 3*i, 1})
	}
	if md := encodeProgress(0, 20000, many); len(md) > maxProgressBytes {
		t.Errorf("metadata of %d bytes", len(md))
	}
	if h, s, err := decodeProgress(5, "someone else's"); h != -1 || s != nil || err != nil {
		t.Errorf("foreign metadata decoded as %d %v %v", h, s, err)
	}
}

// core.OpenSource and core.OpenPublisher reach Kafka by URL.
func TestOpenByURL(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	ctx := context.Background()
	pub, err := core.OpenPublisher(ctx, "kafka://"+bs+"/"+topic)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(ctx, "", &core.Message{ID: "by-url", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	src, err := core.OpenSource(ctx, "kafka://"+bs+"/"+topic+"?group=g-"+randomHex(4)+"&ordering=per-partition&commit_interval=50ms")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if s := src.(*Source); s.cfg.ordering != OrderPerPartition || s.cfg.commitInterval != 50*time.Millisecond {
		t.Errorf("URL parameters not applied: %+v", s.cfg)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	d, err := src.Receive(rctx)
	if err != nil {
		t.Fatal(err)
	}
	if d.Message().ID != "by-url" {
		t.Errorf("got %q", d.Message().ID)
	}
	if _, err := core.OpenSource(ctx, "kafka://"+bs+"/"+topic); err == nil || !strings.Contains(err.Error(), "group") {
		t.Errorf("OpenSource without a group = %v, want an error naming the group", err)
	}
}

// Close leaves no goroutine behind: the group, its generation, the
// partition readers, the commit loop and the writers' connections end.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 3)
	publishN(t, bs, topic, "leak", 9, nil)
	time.Sleep(100 * time.Millisecond)
	before := runtime.NumGoroutine()
	s, err := Open(context.Background(), bs, append(fastGroup(t), WithTopic(topic), WithGroup("g-"+randomHex(4)))...)
	if err != nil {
		t.Fatal(err)
	}
	ds := receiveN(t, s, 9, 10*time.Second)
	for _, d := range ds[:5] {
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := ds[5].DeadLetter(context.Background(), errors.New("to start the DLQ writer")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("%d goroutines after Close, %d before:\n%s", after, before, buf[:n])
	}
}

// A group starting at LastOffset pins its position at once: messages
// published while it is down, before it ever received one, are not
// skipped when it comes back.
func TestStartAtLastOffsetIsPinned(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	group := "g-" + randomHex(4)
	publishN(t, bs, topic, "old", 2, nil)
	s := openSource(t, bs, topic, group, WithStartOffset(kafkago.LastOffset))
	expectNothing(t, s, 300*time.Millisecond) // joins, skips the old ones
	servicetest.WaitFor(t, 5*time.Second, "the start position committed", func() bool {
		return committed(t, bs, group, topic, 1)[0] == 2
	})
	s.Close()
	msgs := publishN(t, bs, topic, "new", 1, nil)
	s2 := openSource(t, bs, topic, group, WithStartOffset(kafkago.LastOffset))
	d := receiveN(t, s2, 1, 10*time.Second)[0]
	if d.Message().ID != msgs[0].ID {
		t.Fatalf("got %q, want %q", d.Message().ID, msgs[0].ID)
	}
}

// After its partition is released, a delivery settles nothing: Ack, Retry
// and DeadLetter fail with ErrStaleDelivery (core.ErrStaleDelivery), and
// DeadLetter writes no copy that the next owner's decision would double.
func TestStaleDeliveriesSettleNothing(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	group := "g-" + randomHex(4)
	publishN(t, bs, topic, "stale", 3, nil)
	s := openSource(t, bs, topic, group)
	ds := receiveN(t, s, 3, 10*time.Second)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	errs := []error{ds[0].Ack(ctx), ds[1].Retry(ctx, 0), ds[2].DeadLetter(ctx, errors.New("late"))}
	for i, err := range errs {
		if !errors.Is(err, core.ErrStaleDelivery) {
			t.Errorf("settlement %d after Close = %v, want one wrapping core.ErrStaleDelivery", i, err)
		}
	}
	if dls := readAll(t, bs, topic+".dlq", 1); len(dls) != 0 {
		t.Errorf("%d dead letters written for a stale delivery", len(dls))
	}
	if s.Stats().StaleSettlements != 3 {
		t.Errorf("StaleSettlements = %d, want 3", s.Stats().StaleSettlements)
	}
	s2 := openSource(t, bs, topic, group)
	if got := receiveN(t, s2, 3, 10*time.Second); got[0].Message().Attempt != 2 {
		t.Errorf("redelivery Attempt = %d, want 2", got[0].Message().Attempt)
	}
}
