package pubsub

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func messages(prefix string, n int) []*driver.Message {
	out := make([]*driver.Message, n)
	for i := range out {
		out[i] = &driver.Message{ID: fmt.Sprintf("%s-%s-%03d", prefix, randomHex(3), i), Body: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	return out
}

// waitFor polls cond until it holds, failing t after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
	}
}

// The Source reports the subscription's ack deadline as its lease, the
// URL's max_extension, that Pub/Sub keeps Retry's delay, and for an
// ordered subscription one message a pull; a message carries its server
// id as BrokerKey and in its metadata.
func TestTraitsAndMessage(t *testing.T) {
	ts := newTestSub(t, "")
	s := ts.open(t, "max_extension=90s")
	tr, err := s.Start(context.Background(), driver.Setup{Window: 100, Logger: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	if want := (driver.Traits{MaxBatch: 1000, Receivers: 4, Lease: 10 * time.Second, MaxExtension: 90 * time.Second, DelaysRetry: true}); tr != want {
		t.Errorf("Traits %+v, want %+v", tr, want)
	}
	ordered := newTestSub(t, "ordering=true")
	tr, _ = ordered.open(t, "").Start(context.Background(), driver.Setup{Window: 100})
	if tr.MaxBatch != 1 || tr.Receivers != 16 || tr.Lease != 10*time.Second || tr.MaxExtension != time.Hour {
		t.Errorf("ordered: Traits %+v, want MaxBatch 1, Receivers 16, Lease 10s, MaxExtension 1h", tr)
	}

	msg := messages("meta", 1)[0]
	msg.Key, msg.Headers = "k1", map[string]string{"h": "v"}
	if err := ts.publish(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, ts.open(t, ""), 10)
	d, err := r.Receive(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m := d.Message()
	md := driver.MetadataOf(m.Metadata)
	if m.ID != msg.ID || m.Key != "k1" || m.Headers["h"] != "v" || m.System != "gcp_pubsub" || m.Source != ts.name || m.Attempt != 1 {
		t.Errorf("received %+v", m)
	}
	if id, _ := m.BrokerKey.(string); id == "" || md["messaging.message.id"] != id {
		t.Errorf("BrokerKey %v, metadata %v: want the server's message id in both", m.BrokerKey, md)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Without a dead-letter policy Pub/Sub sends no delivery attempt; the
// Source counts this process's deliveries, so a retried message's Attempt
// grows and a poison message is parked at MaxAttempts, with its cause,
// instead of looping.
func TestAttemptsWithoutDeadLetterPolicy(t *testing.T) {
	ts := newTestSub(t, "max_deliveries=0")
	if p := ts.policy(t); p != nil {
		t.Fatalf("max_deliveries=0 made a dead-letter policy: %v", p)
	}
	msgs := messages("nopolicy", 2)
	if err := ts.publish(context.Background(), msgs[0]); err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, ts.open(t, ""), 10)
	for want := 1; want <= 3; want++ {
		d, err := r.Receive(ctxFor(t, 30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Message().Attempt; got != want {
			t.Fatalf("delivery %d: Attempt %d", want, got)
		}
		if want < 3 {
			err = d.Retry(context.Background(), 0)
		} else {
			err = d.Ack(context.Background())
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	r.Close()

	e := brokertest.NewEffects(t)
	var calls atomic.Int64
	_, stop := run(t, e, ts.open(t, ""), func(context.Context, *sql.Tx, *core.Message) error {
		calls.Add(1)
		return errors.New("always fails")
	}, core.WithMaxAttempts(3), core.WithBackoff(core.ConstantBackoff(10*time.Millisecond)))
	if err := ts.publish(context.Background(), msgs[1]); err != nil {
		t.Fatal(err)
	}
	var parked []*pb.PubsubMessage
	waitFor(t, time.Minute, "the poison message parked", func() bool {
		got, err := ts.take(context.Background(), ts.name+"-dlq", 10, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		parked = append(parked, got...)
		return len(parked) > 0
	})
	stop()
	if len(parked) != 1 || parked[0].Attributes["message-id"] != msgs[1].ID {
		t.Fatalf("parked %v, want %s", parked, msgs[1].ID)
	}
	if cause := parked[0].Attributes[driver.CauseHeader]; !strings.Contains(cause, core.ErrMaxAttempts.Error()) || parked[0].Attributes[driver.AttemptHeader] != "3" {
		t.Errorf("parked with cause %q at attempt %s, want %q at 3", cause, parked[0].Attributes[driver.AttemptHeader], core.ErrMaxAttempts)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("handler ran %d times, want MaxAttempts = 3", n)
	}
}

func (ts *testSub) policy(t *testing.T) *pb.DeadLetterPolicy {
	s, err := ts.cl.SubscriptionAdminClient.GetSubscription(context.Background(), &pb.GetSubscriptionRequest{Subscription: ts.full("subscriptions", ts.name)})
	if err != nil {
		t.Fatal(err)
	}
	return s.DeadLetterPolicy
}

// A handler that runs for 2.5 times the 10s ack deadline keeps its
// message: the Consumer's heartbeat extends the deadline (ModifyAckDeadline),
// so Pub/Sub never hands it out again, and it is applied once.
func TestSlowHandlerKeepsItsMessage(t *testing.T) {
	ts := newTestSub(t, "")
	msg := messages("slow", 1)
	e := brokertest.NewEffects(t)
	var calls atomic.Int64
	c, stop := run(t, e, ts.open(t, ""), func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		calls.Add(1)
		time.Sleep(25 * time.Second)
		return e.Apply(ctx, tx, m)
	})
	if err := ts.publish(context.Background(), msg...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the slow message processed", func() bool { return c.Stats().Processed == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.WantOnce(t, msg)
	if st := c.Stats(); calls.Load() != 1 || st.Received != 1 || st.Stale != 0 {
		t.Errorf("handler ran %d times; stats %+v: want one delivery, nothing stale", calls.Load(), st)
	}
}

// On a subscription with message ordering, each key's messages are
// applied in the order they were published, by a Consumer with four
// workers and handlers of uneven speed.
func TestOrderingKeepsPerKeyOrder(t *testing.T) {
	ts := newTestSub(t, "ordering=true")
	const keys, per = 4, 6
	var msgs []*driver.Message
	for k := range keys {
		for i := range per {
			msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("ord-%s-%d-%d", randomHex(2), k, i), Key: fmt.Sprintf("key-%d", k), Body: []byte(fmt.Sprint(i))})
		}
	}
	for k := range keys { // a key's messages in one request, in order
		if err := ts.publish(context.Background(), msgs[k*per:(k+1)*per]...); err != nil {
			t.Fatal(err)
		}
	}
	e := brokertest.NewEffects(t)
	var mu sync.Mutex
	seen := map[string][]string{}
	c, stop := run(t, e, ts.open(t, ""), func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
		mu.Lock()
		seen[m.Key] = append(seen[m.Key], string(m.Body))
		mu.Unlock()
		return e.Apply(ctx, tx, m)
	}, core.WithConcurrency(4))
	waitFor(t, time.Minute, "every message processed", func() bool { return c.Stats().Processed == keys*per })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.WantOnce(t, msgs)
	for k, got := range seen {
		if want := "0 1 2 3 4 5"; strings.Join(got, " ") != want {
			t.Errorf("%s applied in the order %v, want %s", k, got, want)
		}
	}
}

// A subscription whose dead-letter policy parks a message after fewer
// deliveries than the Consumer's MaxAttempts: WithStrictDeliveryLimit
// refuses to run, naming both numbers and the gcloud fix; otherwise the
// Consumer warns and runs.
func TestDeliveryLimitAgainstMaxAttempts(t *testing.T) {
	ts := newTestSub(t, "max_deliveries=5")
	e := brokertest.NewEffects(t)
	c, err := core.New(ts.open(t, ""), e.Store(), e.Apply, core.WithName("pubsub-test"), core.WithMaxAttempts(10), core.WithStrictDeliveryLimit())
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(ctxFor(t, time.Minute))
	if err == nil || !strings.Contains(err.Error(), "after 5 deliveries, fewer than the Consumer's 10 attempts") ||
		!strings.Contains(err.Error(), "gcloud pubsub subscriptions update "+ts.name+" --max-delivery-attempts=10") {
		t.Errorf("strict: Run = %v, want a refusal naming 5, 10 and the fix", err)
	}
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logs.Write(p) }), nil))
	c, stop := run(t, e, ts.open(t, ""), e.Apply, core.WithMaxAttempts(10), core.WithLogger(logger))
	waitFor(t, 30*time.Second, "the warning", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logs.String(), "delivery_limit=5 max_attempts=10")
	})
	msg := messages("limit", 1)
	if err := ts.publish(context.Background(), msg...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "a message processed after the warning", func() bool { return c.Stats().Processed == 1 })
	stop()
}

// run runs a Consumer named pubsub-test of src on e until the test ends.
func run(t *testing.T, e *brokertest.Effects, src driver.Source, h core.Handler[*sql.Tx], opts ...core.Option) (*core.Consumer[*sql.Tx], func() error) {
	return e.Run(t, src, h, append([]core.Option{core.WithName("pubsub-test"), core.WithShutdownTimeout(40 * time.Second)}, opts...)...)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// The horizon is the subscriptions' message retention (7 days unless set
// otherwise): a store keeping claims for an hour is refused with
// WithStrictRetention, else warned about, with the gcloud fix.
func TestRetentionAgainstHorizon(t *testing.T) {
	ts := newTestSub(t, "")
	brokertest.RetentionAgainstHorizon(t, func(t *testing.T) driver.Source { return ts.open(t, "") }, time.Hour, "168h0m0s")
	h := ts.open(t, "").HorizonHint(time.Hour)
	if want := "gcloud pubsub subscriptions update " + ts.name + " --message-retention-duration=3600s, and " + ts.name + "-dlq"; !strings.Contains(h, want) {
		t.Errorf("HorizonHint %q, want it to hold %q", h, want)
	}
}

// When the copy cannot be published (the dead-letter topic is gone), the
// message is handed back, not lost: DeadLetter fails for it, and it comes
// again at once.
func TestParkingFailureHandsTheMessageBack(t *testing.T) {
	ts := newTestSub(t, "")
	msg := messages("nopark", 1)
	if err := ts.publish(context.Background(), msg...); err != nil {
		t.Fatal(err)
	}
	if err := ts.cl.TopicAdminClient.DeleteTopic(context.Background(), &pb.DeleteTopicRequest{Topic: ts.full("topics", ts.name+"-dlq")}); err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, ts.open(t, ""), 10)
	d, err := r.Receive(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := d.DeadLetter(context.Background(), errors.New("bad")); err == nil || !strings.Contains(err.Error(), "parking in projects/"+project+"/topics/"+ts.name+"-dlq failed; the message is handed back") {
		t.Fatalf("DeadLetter = %v, want the failed park", err)
	}
	d, err = r.Receive(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if m := d.Message(); m.ID != msg[0].ID || m.Attempt != 2 || time.Since(start) > 5*time.Second {
		t.Errorf("after the failed park: %s attempt %d after %v, want %s attempt 2 at once (the ack deadline is 10s)", m.ID, m.Attempt, time.Since(start), msg[0].ID)
	}
	d.Ack(context.Background())
}

// A cause longer than Pub/Sub takes in an attribute (1,024 bytes) is
// parked cut at a character boundary, not refused.
func TestLongCauseIsParkedCut(t *testing.T) {
	ts := newTestSub(t, "")
	if err := ts.publish(context.Background(), messages("long", 1)...); err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, ts.open(t, ""), 10)
	d, err := r.Receive(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.DeadLetter(context.Background(), errors.New(strings.Repeat("é", 3000))); err != nil {
		t.Fatal(err)
	}
	var parked []*pb.PubsubMessage
	waitFor(t, 30*time.Second, "the copy parked", func() bool {
		parked, err = ts.take(context.Background(), ts.name+"-dlq", 10, time.Second)
		return err == nil && len(parked) == 1
	})
	if c := parked[0].Attributes[driver.CauseHeader]; len(c) < 1000 || len(c) > 1024 || !utf8.ValidString(c) || !strings.HasPrefix(c, "éé") {
		t.Errorf("parked cause of %d bytes (valid UTF-8: %v), want 1,000 to 1,024 valid bytes", len(c), utf8.ValidString(c))
	}
}

// A copy Pub/Sub's dead-letter policy parked (the emulator does not
// forward, so the test publishes one as Pub/Sub does, with its
// CloudPubSubDeadLetter… attributes) is listed with a cause and origin
// saying so, and redriven without those attributes.
func TestCopyParkedByPolicyIsListedAndRedriven(t *testing.T) {
	ts := newTestSub(t, "")
	id := "policy-" + randomHex(4)
	_, err := ts.cl.TopicAdminClient.Publish(context.Background(), &pb.PublishRequest{Topic: ts.full("topics", ts.name+"-dlq"), Messages: []*pb.PubsubMessage{{
		Data: []byte("body"), Attributes: map[string]string{"message-id": id, "CloudPubSubDeadLetterSourceDeliveryCount": "5",
			"CloudPubSubDeadLetterSourceSubscription": ts.name, "CloudPubSubDeadLetterSourceSubscriptionProject": project},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // parked before the listing begins, by the emulator's clock
	q, err := admin.OpenDeadLetters(context.Background(), ts.url(""))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var got []*admin.Parked
	if err := q.Scan(context.Background(), func(p *admin.Parked) error { got = append(got, p); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != id || got[0].Cause != "Pub/Sub's dead-letter policy: delivered 5 times without an acknowledgement" ||
		got[0].Origin != ts.name || got[0].Destination != ts.full("topics", ts.topic) {
		t.Fatalf("listed %+v", got)
	}
	if n, err := admin.Redrive(context.Background(), q, nil, nil); err != nil || n != 1 {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	again, err := ts.take(context.Background(), ts.name, 10, 5*time.Second)
	if err != nil || len(again) != 1 {
		t.Fatalf("after the redrive: %v, %v", again, err)
	}
	for k := range again[0].Attributes {
		if strings.HasPrefix(k, "CloudPubSub") {
			t.Errorf("redriven with %s", k)
		}
	}
}

// Pub/Sub takes one ordering key per Publish request: the Publisher sends
// a request per run of one key, in order, and a topic that does not exist
// fails the call permanently (the outbox relay parks the row).
func TestPublishRequestPerKeyRun(t *testing.T) {
	ts := newTestSub(t, "")
	var mu sync.Mutex
	var requests [][]string
	record := grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if pr, ok := req.(*pb.PublishRequest); ok {
			var keys []string
			for _, m := range pr.Messages {
				keys = append(keys, m.OrderingKey)
			}
			mu.Lock()
			requests = append(requests, keys)
			mu.Unlock()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	pub, err := NewPublisher(context.Background(), ts.url(""), option.WithGRPCDialOption(record))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	msgs := messages("keys", 6)
	for i, k := range []string{"a", "a", "b", "b", "b", ""} {
		msgs[i].Key = k
	}
	if err := pub.Publish(context.Background(), "", msgs...); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(requests); got != "[[a a] [b b b] []]" {
		t.Errorf("Publish requests by key: %s, want [[a a] [b b b] []]", got)
	}
	err = pub.Publish(context.Background(), "no-such-topic-"+randomHex(3), msgs[0])
	if err == nil || !driver.IsPermanent(err) || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("Publish to a missing topic = %v, want a permanent NotFound", err)
	}
}

// A Source reads the id from the attribute id_attribute= names, acks a
// batch in one Acknowledge request, and gives a retried batch back in one
// ModifyAckDeadline request whose deadline is the delay rounded up to a
// whole second, at most Pub/Sub's 600.
func TestSettleRequestsAndIDAttribute(t *testing.T) {
	ts := newTestSub(t, "")
	type request struct {
		method   string
		ids      int
		deadline int32
	}
	var mu sync.Mutex
	var requests []request
	record := grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		mu.Lock()
		switch r := req.(type) {
		case *pb.AcknowledgeRequest:
			requests = append(requests, request{"Acknowledge", len(r.AckIds), 0})
		case *pb.ModifyAckDeadlineRequest:
			requests = append(requests, request{"ModifyAckDeadline", len(r.AckIds), r.AckDeadlineSeconds})
		}
		mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	s, err := Open(context.Background(), ts.url("id_attribute=order-id"), option.WithGRPCDialOption(record))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Start(context.Background(), driver.Setup{Window: 100, Logger: slog.Default()}); err != nil {
		t.Fatal(err)
	}
	const n = 20
	sent := map[string]bool{}
	msgs := messages("attr", n)
	for _, m := range msgs {
		// The business id travels in order-id alone, not in message-id.
		m.Headers, m.ID = map[string]string{"order-id": m.ID}, ""
		sent[m.Headers["order-id"]] = true
	}
	if err := ts.publish(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	var got []*driver.Message
	ctx := ctxFor(t, 30*time.Second)
	for len(got) < n {
		ms, err := s.Receive(ctx, n-len(got))
		if err != nil {
			t.Fatalf("Receive after %d of %d: %v", len(got), n, err)
		}
		got = append(got, ms...)
	}
	for _, m := range got {
		if !sent[m.ID] || m.IDError != nil {
			t.Fatalf("received ID %q (error %v), want one of the order-id attributes sent", m.ID, m.IDError)
		}
		delete(sent, m.ID)
	}
	mu.Lock()
	requests = nil
	mu.Unlock()
	if err := s.Retry(context.Background(), got[:5], 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := s.Retry(context.Background(), got[5:8], 20*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Ack(context.Background(), got[8:]); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []request{{"ModifyAckDeadline", 5, 2}, {"ModifyAckDeadline", 3, 600}, {"Acknowledge", n - 8, 0}}
	if fmt.Sprint(requests) != fmt.Sprint(want) {
		t.Errorf("settlement requests %v, want %v", requests, want)
	}
}
