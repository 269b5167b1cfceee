package kafka

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
)

func offsetOf(d *brokertest.Delivery) int64 { return entryOf(d).r.Offset }

// Out-of-order completion: messages of one partition are acked in a
// random order, and after every ack the committed offset, once the commit
// happened, is never past the lowest message still undecided.
func TestOutOfOrderAcksNeverCommitPastUndecided(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	group := "g-" + randomHex(4)
	const n = 40
	publishN(t, bs, topic, "ooo", n, nil)
	s, r := startSource(t, bs, topic, group, 0, WithOrdering(OrderNone), WithCommit(time.Hour, 1))
	ds := receiveN(t, r, n, 10*time.Second)
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
	_, s := startSource(t, bs, topic, group, 10, WithOrdering(OrderPerPartition))
	first := receiveN(t, s, 2, 10*time.Second) // one per partition: the partition waits for its in-flight one
	if entryOf(first[0]).p == entryOf(first[1]).p {
		t.Fatalf("OrderPerPartition handed out two messages of partition %d at once", entryOf(first[0]).r.Partition)
	}
	held, other := first[0], first[1]
	heldPart, heldOffset := entryOf(held).r.Partition, entryOf(held).r.Offset
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
		if entryOf(d).r.Partition == heldPart {
			if d.Message().ID != held.Message().ID {
				t.Fatalf("partition %d skipped ahead to %q while %q was waiting for its retry", heldPart, d.Message().ID, held.Message().ID)
			}
			if time.Since(start) < 400*time.Millisecond {
				t.Fatalf("retried after %v, before its delay", time.Since(start))
			}
			if d.Message().Attempt != 2 {
				t.Fatalf("retry Attempt = %d, want 2", d.Message().Attempt)
			}
			if c := committed(t, bs, group, topic, 2)[heldPart]; c > heldOffset {
				t.Fatalf("committed %d on partition %d past the retried offset %d", c, heldPart, heldOffset)
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
	_, s := startSource(t, bs, topic, group, 0, WithRetryTopic(topic+".retry"))
	ds := receiveN(t, s, 3, 10*time.Second)
	var retried *brokertest.Delivery
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
	origin := entryOf(retried).r
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
	if got, want := m.Headers[driver.OriginHeader], topic+"/"+strconv.Itoa(int(origin.Partition))+"/"+strconv.FormatInt(origin.Offset, 10); got != want {
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
	_, s := startSource(t, bs, topic, group, 0)
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
	src, s := startSource(t, bs, topic, group, 0)
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
	_ = src

	// CloudEvents' ce_id as the id header, read by a new group.
	_, s2 := startSource(t, bs, topic, "g-"+randomHex(4), 0, WithIDHeader("ce_id"))
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
	retention := "3600000"
	if _, err := adminClient(t, bs).CreateTopic(ctx, 1, 1, map[string]*string{"retention.ms": &retention}, topic); err != nil {
		t.Fatalf("create: %v", err)
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
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithStart(9)}, "WithStart"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithStart(StartAsIs)}, "WithStart"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithInstanceID("")}, "WithInstanceID"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithGroupProtocol(7)}, "WithGroupProtocol"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithIDHeader("")}, "WithIDHeader"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithPartitionBuffer(0)}, "WithPartitionBuffer"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithClientOptions(nil)}, "WithClientOptions"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithLogger(nil)}, "WithLogger"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithRetryTopic("t")}, "WithRetryTopic"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithDeadLetterTopic("a/b")}, "WithDeadLetterTopic"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithBatchTimeout(-1)}, "WithBatchTimeout"},
		{"h:1", []Option{WithTopic("t"), WithGroup("")}, "WithGroup"},
		{"h:1", []Option{WithTopic("t"), WithGroup("g"), WithBalancers()}, "WithBalancers"},
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
		{"kafka://h:1/t?group=g&tls=true&ca_file=/s3cret/no/such.pem", nil, "kafka URL parameter ca_file: open: no such file"},
		{"kafka://h:1/t?group=g&group=h", nil, "kafka URL parameter group: given 2 times"},
		{"kafka://h:1/t?group=g&group_protocol=next", nil, "URL parameter group_protocol"},
		{"kafka://h:1/t?group=g&max_extension=1s", nil, `unknown parameter "max_extension"`},
		{"kafka://h:1/t?group=g&window=10", nil, `unknown parameter "window"`},
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
	uopts, err := parseTarget("kafka://a:1,b:2/payments?group=billing&ordering=none&commit_count=7&start=last&revoke_timeout=3s&id_header=ce_id&dead_letter_topic=dl&dead_letter_group=ops&retry_topic=rt&session_timeout=8s&heartbeat_interval=1s&instance_id=pod-0&group_protocol=consumer&offset_id=true", &cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range uopts {
		if err := o.apply(&cfg); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.topic != "payments" || cfg.group != "billing" || len(cfg.brokers) != 2 || cfg.ordering != OrderNone || cfg.commitCount != 7 ||
		cfg.commitInterval != time.Second || cfg.start != StartLast || cfg.revokeTimeout != 3*time.Second || cfg.instanceID != "pod-0" || cfg.protocol != ProtocolConsumer || !cfg.offsetID ||
		cfg.idHeader != "ce_id" || cfg.deadLetterTopic != "dl" || cfg.deadLetterGroup != "ops" || cfg.retryTopic != "rt" ||
		cfg.sessionTimeout != 8*time.Second || cfg.heartbeatInterval != time.Second || cfg.rebalanceTimeout != 30*time.Second {
		t.Errorf("parseTarget: %+v", cfg)
	}
	for _, bad := range []string{"kafka://h:1/t?ordering=random", "kafka://h:1/t?start=middle", "kafka://h:1/t?commit_interval=soon", "kafka://h:1/t?group=a&group=b"} {
		if _, err := parseTarget(bad, &cfg, nil); err == nil || !strings.Contains(err.Error(), "URL parameter") {
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
	src, err := core.OpenSource(ctx, "kafka://"+bs+"/"+topic+"?group=g-"+randomHex(4)+"&ordering=per-partition&commit_interval=50ms&instance_id=by-url-0")
	if err != nil {
		t.Fatal(err)
	}
	if s := src.(*Source); s.cfg.ordering != OrderPerPartition || s.cfg.commitInterval != 50*time.Millisecond || s.cfg.instanceID != "by-url-0" {
		t.Errorf("URL parameters not applied: %+v", s.cfg)
	}
	if d := receiveN(t, brokertest.StartReceiver(t, src, 0), 1, 10*time.Second)[0]; d.Message().ID != "by-url" {
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
	r, err := brokertest.NewReceiver(context.Background(), s, 100, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ds := receiveN(t, r, 9, 10*time.Second)
	for _, d := range ds[:5] {
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := ds[5].DeadLetter(context.Background(), errors.New("to start producing copies")); err != nil {
		t.Fatal(err)
	}
	if err := ds[6].Retry(context.Background(), time.Hour); err != nil { // held for its delay, given back at Close
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
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
	src, s := startSource(t, bs, topic, group, 0, WithStart(StartLast))
	expectNothing(t, s, 300*time.Millisecond) // joins, skips the old ones
	servicetest.WaitFor(t, 5*time.Second, "the start position committed", func() bool {
		return committed(t, bs, group, topic, 1)[0] == 2
	})
	src.Close()
	msgs := publishN(t, bs, topic, "new", 1, nil)
	_, s2 := startSource(t, bs, topic, group, 0, WithStart(StartLast))
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
	s, r := startSource(t, bs, topic, group, 0)
	ds := receiveN(t, r, 3, 10*time.Second)
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
	if dls := readAll(t, bs, topic+".dlq"); len(dls) != 0 {
		t.Errorf("%d dead letters written for a stale delivery", len(dls))
	}
	if s.Stats().StaleSettlements != 3 {
		t.Errorf("StaleSettlements = %d, want 3", s.Stats().StaleSettlements)
	}
	_, s2 := startSource(t, bs, topic, group, 0)
	if got := receiveN(t, s2, 3, 10*time.Second); got[0].Message().Attempt != 2 {
		t.Errorf("redelivery Attempt = %d, want 2", got[0].Message().Attempt)
	}
}

// waitingOf returns how many messages s fetched and has not handed out,
// and whether the partition is paused.
func waitingOf(s *Source) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	paused := false
	for _, p := range s.parts {
		paused = paused || p.paused
	}
	return s.waitingLocked(), paused
}

// A Consumer that holds its window gets no more than WithPartitionBuffer
// messages a partition (and one poll) fetched ahead: the source stops
// polling instead of pausing the partition, which would drop and fetch
// again what franz-go buffered. Messages held past their fetch, handed out
// or decided behind an undecided one, pause the partition at
// WithPartitionBuffer, and resume it once a quarter of that is free.
func TestFetchingAheadIsBounded(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	publishN(t, bs, topic, "ahead", 3000, nil)
	s, r := startSource(t, bs, topic, "g-"+randomHex(4), 10, WithOrdering(OrderNone), WithPartitionBuffer(50))
	ds := receiveN(t, r, 10, 10*time.Second)
	time.Sleep(300 * time.Millisecond) // polling would go on meanwhile
	if n, paused := waitingOf(s); n > 50+pollRecords || n < 10 || paused {
		t.Fatalf("%d messages fetched ahead of a full window of 10 (paused %v), want at most %d and no pause", n, paused, 50+pollRecords)
	}
	// The first held, the next ones decided behind it: the partition
	// pauses at 50 held.
	head := ds[0]
	for n := len(ds); n < 60; n++ {
		if err := ds[n-1].Ack(context.Background()); err != nil { // each received before its ack
			t.Fatal(err)
		}
		if n == 10 {
			for _, d := range ds[1:9] {
				if err := d.Ack(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		}
		ds = append(ds, receiveN(t, r, 1, 10*time.Second)...)
	}
	if _, paused := waitingOf(s); !paused {
		t.Fatal("60 messages held behind an undecided one, the partition not paused")
	}
	if err := head.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, paused := waitingOf(s); paused {
		t.Fatal("the partition stayed paused once the messages held were committed")
	}
}

// By default a partition pauses only past the Consumer's window (at least
// 1000 messages): several workers decide a partition's messages out of
// order, and a pause would make franz-go drop what it fetched while the
// Consumer still has room.
func TestPartitionBufferFollowsTheWindow(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	publishN(t, bs, topic, "window", 1300, nil)
	s, r := startSource(t, bs, topic, "g-"+randomHex(4), 1500, WithOrdering(OrderNone))
	ds := receiveN(t, r, 1300, 30*time.Second)
	for _, d := range ds[1:] { // decided behind the first, held
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if _, paused := waitingOf(s); paused {
		t.Fatal("1,299 messages held behind an undecided one under a window of 1,500: the partition paused")
	}
	if err := ds[0].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}
