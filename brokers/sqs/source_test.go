package sqs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/sqlite"
)

// open opens a Source on q with the test endpoint, short polls and the
// test logger; it is closed when the test ends.
func open(t testing.TB, ep string, q testQueue, opts ...Option) *Source {
	t.Helper()
	all := append(clientOpts(ep), WithLogger(testLogger(t)), WithWaitTime(time.Second))
	s, err := Open(context.Background(), q.addr(), append(all, opts...)...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func publisher(t testing.TB, ep string, q testQueue) *Publisher {
	t.Helper()
	p, err := NewPublisher(context.Background(), q.addr(), publisherOpts(ep)...)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	return p
}

// publish sends ms to q with the adapter's Publisher.
func publish(t testing.TB, ep string, q testQueue, ms ...*driver.Message) {
	t.Helper()
	if err := publisher(t, ep, q).Publish(context.Background(), "", ms...); err != nil {
		t.Fatal(err)
	}
}

func msgs(prefix string, n int) []*driver.Message {
	run := randomHex(3)
	out := make([]*driver.Message, n)
	for i := range out {
		out[i] = &driver.Message{ID: fmt.Sprintf("%s-%s-%04d", prefix, run, i), Body: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	return out
}

// receiver drives s as a Consumer does, one message at a time, with
// window (0: brokertest.DefaultWindow).
func receiver(t testing.TB, s driver.Source, window int) *brokertest.Receiver {
	t.Helper()
	return brokertest.StartReceiver(t, s, window)
}

// receiveOne receives one delivery within timeout.
func receiveOne(t testing.TB, r *brokertest.Receiver, timeout time.Duration) *brokertest.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		d, err := r.Receive(ctx)
		if err == nil {
			return d
		}
		if ctx.Err() != nil {
			t.Fatalf("no delivery within %v", timeout)
		}
		t.Logf("receive: %v", err)
	}
}

// quiet fails if r delivers anything within d.
func quiet(t testing.TB, r *brokertest.Receiver, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		dl, err := r.Receive(ctx)
		if err == nil {
			t.Fatalf("unexpected delivery of %q (attempt %d)", dl.Message().ID, dl.Message().Attempt)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

func TestOptionErrorsNameTheOption(t *testing.T) {
	cases := []struct {
		opt  Option
		name string
	}{
		{WithReceivers(0), "WithReceivers"},
		{WithWaitTime(21 * time.Second), "WithWaitTime"},
		{WithWaitTime(1500 * time.Millisecond), "WithWaitTime"},
		{WithVisibilityTimeout(0), "WithVisibilityTimeout"},
		{WithMaxExtension(13 * time.Hour), "WithMaxExtension"},
		{WithDeadLetterQueue(""), "WithDeadLetterQueue"},
		{WithDeadLetterMode(7), "WithDeadLetterMode"},
		{WithCloseTimeout(-1), "WithCloseTimeout"},
		{WithLogger(nil), "WithLogger"},
	}
	// The client options are a Publisher's too.
	shared := []struct {
		opt  ClientOption
		name string
	}{
		{WithIDAttribute("bad name"), "WithIDAttribute"},
		{WithIDAttribute(""), "WithIDAttribute"},
		{WithSettleRetries(11), "WithSettleRetries"},
		{WithClient(nil), "WithClient"},
		{WithEndpoint("localhost:9324"), "WithEndpoint"},
		{WithRegion(""), "WithRegion"},
		{WithStaticCredentials("", "x", ""), "WithStaticCredentials"},
	}
	for _, c := range shared {
		cases = append(cases, struct {
			opt  Option
			name string
		}{c.opt, c.name})
		_, err := NewPublisher(context.Background(), "sqs://q", c.opt)
		if err == nil || !strings.Contains(err.Error(), c.name) {
			t.Errorf("NewPublisher with a bad %s: err = %v, want one naming %s", c.name, err, c.name)
		}
	}
	for _, c := range cases {
		_, err := Open(context.Background(), "sqs://q", c.opt)
		if err == nil || !strings.Contains(err.Error(), c.name) {
			t.Errorf("Open with a bad %s: err = %v, want one naming %s", c.name, err, c.name)
		}
	}
}

func TestOpenChecksQueueAndDeadLetterSetup(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	ctx := context.Background()
	if _, err := Open(ctx, "sqs://idemq-missing-"+randomHex(4), clientOpts(ep)...); err == nil {
		t.Error("Open of a missing queue succeeded")
	}
	plain := newQueue(t, ep, "", map[string]string{"VisibilityTimeout": "3"})
	_, err := Open(ctx, plain.addr(), clientOpts(ep)...)
	if err == nil || !strings.Contains(err.Error(), "WithDeadLetterQueue") {
		t.Errorf("Open without a DLQ or redrive policy: err = %v, want one naming WithDeadLetterQueue", err)
	}
	_, err = Open(ctx, plain.addr(), append(clientOpts(ep), WithDeadLetterMode(DeadLetterRedrive))...)
	if err == nil || !strings.Contains(err.Error(), "WithDeadLetterMode") {
		t.Errorf("DeadLetterRedrive without a redrive policy: err = %v, want one naming WithDeadLetterMode", err)
	}
	fifo, _ := newQueueWithDLQ(t, ep, true, 3, 0)
	_, err = Open(ctx, fifo.addr(), append(clientOpts(ep), WithDeadLetterQueue(plain.name))...)
	if err == nil || !strings.Contains(err.Error(), "FIFO") {
		t.Errorf("FIFO queue with a standard DLQ: err = %v, want a FIFO mismatch", err)
	}

	// A redrive policy names the DLQ; its retention bounds the horizon.
	q, dlq := newQueueWithDLQ(t, ep, false, 3, 5)
	cl := testClient(ep)
	if _, err := cl.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: aws.String(q.url), Attributes: map[string]string{"MessageRetentionPeriod": "3600"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: aws.String(dlq.url), Attributes: map[string]string{"MessageRetentionPeriod": "7200"}}); err != nil {
		t.Fatal(err)
	}
	s := open(t, ep, q)
	if s.dlq == nil || s.dlq.name != dlq.name {
		t.Fatalf("dead-letter queue from the redrive policy = %+v, want %s", s.dlq, dlq.name)
	}
	if h, ok := s.RedeliveryHorizon(ctx); !ok || h != 2*time.Hour {
		t.Errorf("RedeliveryHorizon = %v, %v; want 2h (the DLQ's retention), true", h, ok)
	}
	if s.QueueName() != q.name || s.FIFO() || s.VisibilityTimeout() != 3*time.Second {
		t.Errorf("QueueName %q FIFO %v VisibilityTimeout %v", s.QueueName(), s.FIFO(), s.VisibilityTimeout())
	}
}

// TestMessageFields checks what a delivery carries: the business id from
// the message-id attribute (not the SQS MessageId), headers, the trace
// context the publisher injected, attempts from ApproximateReceiveCount,
// the metadata, and a binary body that had to travel base64-encoded.
func TestMessageFields(t *testing.T) {
	ep := sqsEndpoint(t)
	q, _ := newQueueWithDLQ(t, ep, false, 5, 0)
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "publish")
	traceID := span.SpanContext().TraceID().String()

	m := &driver.Message{ID: "order-" + randomHex(4), Body: []byte{0, 1, 2, 0xff, 'x'}, Headers: map[string]string{"tenant": "acme", "empty": ""}}
	if err := publisher(t, ep, q).Publish(ctx, "", m); err != nil {
		t.Fatal(err)
	}
	span.End()
	r := receiver(t, open(t, ep, q, WithDeadLetterQueue(q.name)), 0)
	d := receiveOne(t, r, 10*time.Second)
	got := d.Message()
	if got.ID != m.ID {
		t.Errorf("ID = %q, want the message-id attribute %q", got.ID, m.ID)
	}
	if driver.MetadataOf(got.Metadata)["messaging.message.id"] == got.ID || driver.MetadataOf(got.Metadata)["messaging.message.id"] == "" {
		t.Errorf("metadata messaging.message.id = %q, want the SQS MessageId", driver.MetadataOf(got.Metadata)["messaging.message.id"])
	}
	if string(got.Body) != string(m.Body) {
		t.Errorf("Body = %x, want %x", got.Body, m.Body)
	}
	if got.Headers["tenant"] != "acme" {
		t.Errorf("header tenant = %q", got.Headers["tenant"])
	}
	if _, ok := got.Headers["empty"]; ok {
		t.Error("an empty header was sent; SQS refuses empty attribute values")
	}
	if tp := got.Headers["traceparent"]; !strings.Contains(tp, traceID) {
		t.Errorf("traceparent header = %q, want the publisher's trace %s", tp, traceID)
	}
	if got.System != "aws_sqs" || got.Source != q.name || got.Attempt != 1 || got.Key != "" {
		t.Errorf("System %q Source %q Attempt %d Key %q", got.System, got.Source, got.Attempt, got.Key)
	}
	if driver.MetadataOf(got.Metadata)["aws.sqs.queue.url"] != q.url || driver.MetadataOf(got.Metadata)["messaging.destination.name"] != q.name {
		t.Errorf("metadata %v", got.Metadata)
	}
	if err := d.Retry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	d2 := receiveOne(t, r, 10*time.Second)
	if d2.Message().Attempt != 2 {
		t.Errorf("Attempt after one retry = %d, want 2", d2.Message().Attempt)
	}
	if err := d2.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestPublisherRefusesWhatSQSWould(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q := newQueue(t, ep, "", nil)
	fifo := newQueue(t, ep, ".fifo", map[string]string{"FifoQueue": "true"})
	ctx := context.Background()
	h := map[string]string{}
	for i := range 10 {
		h[fmt.Sprintf("h%d", i)] = "v"
	}
	cases := []struct {
		q    testQueue
		m    *driver.Message
		want string
	}{
		{q, &driver.Message{ID: "a", Body: []byte("x"), Headers: h}, "attributes"},
		{q, &driver.Message{ID: "a", Body: nil}, "empty body"},
		{q, &driver.Message{ID: "a", Body: []byte("x"), Headers: map[string]string{"bad key": "v"}}, "bad key"},
		{fifo, &driver.Message{ID: "a", Body: []byte("x")}, "group id"},
		{fifo, &driver.Message{ID: "a", Body: []byte("x"), Key: strings.Repeat("k", 129)}, "at most 128"},
		{fifo, &driver.Message{ID: "a", Body: []byte("x"), Key: "customer 9"}, "ASCII punctuation"},
	}
	for _, c := range cases {
		err := publisher(t, ep, c.q).Publish(ctx, "", c.m)
		if err == nil || !strings.Contains(err.Error(), c.want) || !core.IsPermanent(err) {
			t.Errorf("Publish %+v: err = %v, want one about %q marked permanent", c.m, err, c.want)
		}
	}
	if vis, inflight := queueCounts(t, ep, q.url); vis+inflight != 0 {
		t.Errorf("refused messages reached the queue: %d", vis+inflight)
	}
	// A bad group id fails the whole call before any of it is sent.
	err := publisher(t, ep, fifo).Publish(ctx, "", &driver.Message{ID: "ok", Body: []byte("x"), Key: "c-1"},
		&driver.Message{ID: "bad", Body: []byte("x"), Key: "c 2"})
	if err == nil || !core.IsPermanent(err) || !strings.Contains(err.Error(), `"bad"`) {
		t.Errorf("Publish with one bad group id = %v, want a permanent error naming it", err)
	}
	if vis, inflight := queueCounts(t, ep, fifo.url); vis+inflight != 0 {
		t.Errorf("a call refused for one bad group id sent %d messages", vis+inflight)
	}
	// Every punctuation character is a valid group id.
	if err := publisher(t, ep, fifo).Publish(ctx, "", &driver.Message{ID: "p", Body: []byte("x"), Key: "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"}); err != nil {
		t.Errorf("Publish with punctuation in the group id: %v", err)
	}
}

// TestPublisherPermanentAnswers: what SQS refuses for good fails Publish
// with an error marked permanent: a message over the queue's
// MaximumMessageSize (refused before anything is sent, or by SQS as a
// sender fault when the limit was lowered after the Publisher read it), a
// queue name that does not exist, and a queue deleted after the Publisher
// resolved it. A raised limit is seen at once.
func TestPublisherPermanentAnswers(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	ctx := context.Background()
	q := newQueue(t, ep, "", map[string]string{"MaximumMessageSize": "1024"})
	limit := func(n string) {
		if _, err := testClient(ep).SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: aws.String(q.url),
			Attributes: map[string]string{"MaximumMessageSize": n}}); err != nil {
			t.Fatal(err)
		}
	}
	pub := publisher(t, ep, q)
	small := &driver.Message{ID: "small", Body: []byte("fits")}
	large := &driver.Message{ID: "large", Body: []byte(strings.Repeat("x", 2048))}
	err := pub.Publish(ctx, "", small, large)
	if err == nil || !strings.Contains(err.Error(), "MaximumMessageSize") || !strings.Contains(err.Error(), `"large"`) || !core.IsPermanent(err) {
		t.Fatalf("Publish over MaximumMessageSize = %v, want an error naming the message and the limit, marked permanent", err)
	}
	if got := drain(t, ep, q.url); len(got) != 0 {
		t.Fatalf("the queue holds %d messages after a refused call, want none", len(got))
	}
	limit("4096")
	if err := pub.Publish(ctx, "", small, large); err != nil {
		t.Fatalf("Publish after the limit was raised: %v", err)
	}
	if got := drain(t, ep, q.url); len(got) != 2 {
		t.Fatalf("the queue holds %d messages, want 2", len(got))
	}
	limit("1024") // the Publisher still knows 4096: SQS refuses the entry
	err = pub.Publish(ctx, "", small, large)
	if err == nil || !strings.Contains(err.Error(), "InvalidParameterValue") || !strings.Contains(err.Error(), `"large"`) || !core.IsPermanent(err) {
		t.Fatalf("Publish over a lowered MaximumMessageSize = %v, want SQS's InvalidParameterValue naming the message, marked permanent", err)
	}
	// SendMessageBatch takes the entries it can: the small one went.
	if got := drain(t, ep, q.url); len(got) != 1 || aws.ToString(got[0].Body) != "fits" {
		t.Fatalf("the queue holds %d messages, want the small one alone", len(got))
	}

	err = pub.Publish(ctx, "idemq-no-such-queue-"+randomHex(6), small)
	if err == nil || !strings.Contains(err.Error(), "does not exist") || !core.IsPermanent(err) {
		t.Fatalf("Publish to a missing queue = %v, want QueueDoesNotExist marked permanent", err)
	}

	gone := newQueue(t, ep, "", nil)
	pub2 := publisher(t, ep, gone)
	if _, err := testClient(ep).DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(gone.url)}); err != nil {
		t.Fatal(err)
	}
	err = pub2.Publish(ctx, "", small)
	if err == nil || !strings.Contains(err.Error(), "SendMessageBatch") || !core.IsPermanent(err) {
		t.Fatalf("Publish to a deleted queue = %v, want SendMessageBatch's QueueDoesNotExist marked permanent", err)
	}
}

// TestAckBatchManyChunks acks 25 deliveries in one Ack call (three
// DeleteMessageBatch requests) beside one settled before, which the flow
// refuses; the Source itself refuses a foreign message, sending nothing
// for it.
func TestAckBatchManyChunks(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, _ := newQueueWithDLQ(t, ep, false, 10, 0)
	other, _ := newQueueWithDLQ(t, ep, false, 10, 0)
	publish(t, ep, q, msgs("chunks", 25)...)
	publish(t, ep, other, msgs("other", 1)...)
	s := open(t, ep, q, WithDeadLetterQueue(q.name))
	r := receiver(t, s, 30)
	r2 := receiver(t, open(t, ep, other, WithDeadLetterQueue(other.name)), 0)
	// Each wait outlasts the 10 s visibility timeout: a ReceiveMessage
	// answer lost after its 200 (aws/aws-sdk-go-v2#2737, seen with the
	// emulator) hides its messages until then.
	var ds []*brokertest.Delivery
	for range 25 {
		ds = append(ds, receiveOne(t, r, 25*time.Second))
	}
	foreign := receiveOne(t, r2, 25*time.Second)
	if err := s.Ack(context.Background(), []*driver.Message{foreign.Message()}); err == nil || !strings.Contains(err.Error(), "not from this source") {
		t.Errorf("Ack of a foreign message: %v", err)
	}
	if err := ds[0].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := s.Stats().DeleteCalls
	if err := r.AckBatch(context.Background(), ds); err == nil || !errors.Is(err, driver.ErrAlreadySettled) {
		t.Errorf("AckBatch with a settled delivery: %v", err)
	}
	if n := s.Stats().DeleteCalls - before; n != 3 {
		t.Errorf("AckBatch of 24 sent %d DeleteMessageBatch requests, want 3", n)
	}
	if vis, inflight := queueCounts(t, ep, q.url); vis+inflight != 0 {
		t.Errorf("after AckBatch %d visible and %d in flight, want none", vis, inflight)
	}
	if err := foreign.Ack(context.Background()); err != nil {
		t.Errorf("the foreign delivery is still its own source's to settle: %v", err)
	}
}

// TestHeartbeatKeepsSlowHandlerInvisible runs a handler 2.5 times slower
// than the visibility timeout next to a second consumer of the same queue:
// with the heartbeat on, the message is never redelivered meanwhile.
func TestHeartbeatKeepsSlowHandlerInvisible(t *testing.T) {
	ep := sqsEndpoint(t)
	q, _ := newQueueWithDLQ(t, ep, false, 2, 0)
	st := sqliteStore(t)
	m := msgs("slow", 1)[0]
	publish(t, ep, q, m)
	var calls atomic.Int32
	slow := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		calls.Add(1)
		time.Sleep(5 * time.Second) // 2.5 visibility timeouts
		return st.apply(ctx, tx, m)
	}
	s1 := open(t, ep, q, WithDeadLetterQueue(q.name))
	a := runConsumer(t, s1, st.Store, slow)
	servicetest.WaitFor(t, 10*time.Second, "the slow handler to start", func() bool { return calls.Load() == 1 })
	s2 := open(t, ep, q, WithDeadLetterQueue(q.name))
	b := runConsumer(t, s2, st.Store, slow)
	servicetest.WaitFor(t, 20*time.Second, "the message to be processed", func() bool { return a.c.Stats().Processed == 1 })
	time.Sleep(2500 * time.Millisecond) // one more visibility timeout: nothing may come back
	if n := calls.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if ra, rb := a.c.Stats().Received, b.c.Stats().Received; ra != 1 || rb != 0 {
		t.Errorf("consumers received %d and %d deliveries, want 1 and 0: the message was redelivered while the heartbeat ran", ra, rb)
	}
	if ext := s1.Stats().Extended; ext < 3 {
		t.Errorf("heartbeat extended %d times over 5s at a 2s visibility timeout, want >= 3", ext)
	}
	if n := st.count(t, m.ID); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
	if vis, inflight := queueCounts(t, ep, q.url); vis+inflight != 0 {
		t.Errorf("queue holds %d+%d messages after the ack, want none", vis, inflight)
	}
}

// TestDefaultVisibilityHeartbeat: on a queue made with SQS's defaults (a
// 30s VisibilityTimeout) a Source that sets none asks for
// DefaultVisibilityTimeout, so a crashed consumer's messages come back
// within it; a handler slower than two of them, next to a second consumer
// of the queue, keeps its message: the heartbeat extends it, and the
// message is received, handled and applied once.
func TestDefaultVisibilityHeartbeat(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q := newQueue(t, ep, "", nil)
	st := sqliteStore(t)
	m := msgs("default-vis", 1)[0]
	publish(t, ep, q, m)
	s1 := open(t, ep, q, WithDeadLetterQueue(q.name))
	if v := s1.VisibilityTimeout(); v != DefaultVisibilityTimeout {
		t.Fatalf("VisibilityTimeout() = %v on a queue with SQS's defaults, want DefaultVisibilityTimeout (%v)", v, DefaultVisibilityTimeout)
	}
	var calls atomic.Int32
	slow := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		calls.Add(1)
		time.Sleep(2*DefaultVisibilityTimeout + time.Second)
		return st.apply(ctx, tx, m)
	}
	a := runConsumer(t, s1, st.Store, slow)
	servicetest.WaitFor(t, 10*time.Second, "the slow handler to start", func() bool { return calls.Load() == 1 })
	s2 := open(t, ep, q, WithDeadLetterQueue(q.name))
	b := runConsumer(t, s2, st.Store, slow)
	servicetest.WaitFor(t, 30*time.Second, "the message to be processed", func() bool { return a.c.Stats().Processed == 1 })
	if n := calls.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if ra, rb := a.c.Stats().Received, b.c.Stats().Received; ra != 1 || rb != 0 {
		t.Errorf("consumers received %d and %d deliveries, want 1 and 0: the message was redelivered while the heartbeat ran", ra, rb)
	}
	if ext, failed := s1.Stats().Extended, s1.Stats().HeartbeatFailures; ext < 2 || failed != 0 {
		t.Errorf("heartbeat extended %d times (%d failures) over two visibility timeouts, want >= 2 (and none)", ext, failed)
	}
	if n := st.count(t, m.ID); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
	if vis, inflight := queueCounts(t, ep, q.url); vis+inflight != 0 {
		t.Errorf("queue holds %d+%d messages after the ack, want none", vis, inflight)
	}
	// With the heartbeat off nothing extends the visibility: a Source asks
	// for the queue's own, made for its handlers.
	if s := open(t, ep, q, WithDeadLetterQueue(q.name), WithHeartbeat(false)); s.VisibilityTimeout() != 30*time.Second {
		t.Errorf("VisibilityTimeout() with the heartbeat off = %v, want the queue's 30s", s.VisibilityTimeout())
	}
	if s := open(t, ep, q, WithDeadLetterQueue(q.name), WithVisibilityTimeout(9*time.Second)); s.VisibilityTimeout() != 9*time.Second {
		t.Errorf("VisibilityTimeout() with WithVisibilityTimeout(9s) = %v", s.VisibilityTimeout())
	}
}

// TestTraits: the Consumer keeps one long poll per ten messages of its
// window outstanding (at least two) unless WithReceivers says, its lease
// is the visibility each receive asks for, and with the heartbeat off it
// never extends one (a nanosecond's MaxExtension), reckoning staleness
// from the queue's own visibility timeout.
func TestTraits(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, _ := newQueueWithDLQ(t, ep, false, 30, 0)
	for _, c := range []struct {
		window int
		opts   []Option
		want   driver.Traits
	}{
		{45, nil, driver.Traits{MaxBatch: 10, Receivers: 5, Lease: DefaultVisibilityTimeout, MaxExtension: time.Hour, DelaysRetry: true, ReceiveLinger: 50 * time.Millisecond}},
		{5, nil, driver.Traits{MaxBatch: 10, Receivers: 2, Lease: DefaultVisibilityTimeout, MaxExtension: time.Hour, DelaysRetry: true, ReceiveLinger: 50 * time.Millisecond}},
		{45, []Option{WithReceivers(3), WithMaxExtension(time.Minute)}, driver.Traits{MaxBatch: 10, Receivers: 3, Lease: DefaultVisibilityTimeout, MaxExtension: time.Minute, DelaysRetry: true, ReceiveLinger: 50 * time.Millisecond}},
		{45, []Option{WithHeartbeat(false)}, driver.Traits{MaxBatch: 10, Receivers: 5, Lease: 30 * time.Second, MaxExtension: -1, DelaysRetry: true, ReceiveLinger: 50 * time.Millisecond}},
	} {
		if got := receiver(t, open(t, ep, q, append(c.opts, WithDeadLetterQueue(q.name))...), c.window).Traits(); got != c.want {
			t.Errorf("window %d, options %d: Traits %+v, want %+v", c.window, len(c.opts), got, c.want)
		}
	}
}

// TestHeartbeatStopsAtMaxExtension holds a message past WithMaxExtension:
// its visibility lapses and another consumer receives it.
func TestHeartbeatStopsAtMaxExtension(t *testing.T) {
	ep := sqsEndpoint(t)
	q, _ := newQueueWithDLQ(t, ep, false, 1, 0)
	publish(t, ep, q, msgs("cap", 1)...)
	// A window of one: s1 cannot receive the message again itself.
	s1 := open(t, ep, q, WithDeadLetterQueue(q.name), WithMaxExtension(2*time.Second))
	r1 := receiver(t, s1, 1)
	start := time.Now()
	d := receiveOne(t, r1, 10*time.Second)
	d2 := receiveOne(t, receiver(t, open(t, ep, q, WithDeadLetterQueue(q.name)), 0), 10*time.Second)
	took := time.Since(start)
	// Extended at least once (past the 1s visibility timeout), never past
	// the 2s cap (plus the time a poll takes to see the lapse).
	if took < 1200*time.Millisecond || took > 3500*time.Millisecond {
		t.Errorf("redelivered after %v, want between one visibility timeout and shortly after the 2s maximum extension", took)
	}
	if s1.Stats().Extended < 1 {
		t.Error("the heartbeat never extended the message")
	}
	if d2.Message().ID != d.Message().ID || d2.Message().Attempt != 2 {
		t.Errorf("second consumer got %q attempt %d", d2.Message().ID, d2.Message().Attempt)
	}
	t.Logf("redelivered after %v; extensions %d", took, s1.Stats().Extended)
	if err := d2.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestWithoutHeartbeatRedeliveryIsDuplicate turns the heartbeat off: a
// handler slower than the visibility timeout lets the message be received
// again, and that copy is decided Duplicate once the first commits — the
// dedup key, not the visibility timeout, keeps the effect single.
func TestWithoutHeartbeatRedeliveryIsDuplicate(t *testing.T) {
	ep := sqsEndpoint(t)
	pg := postgresURL(t)
	q, _ := newQueueWithDLQ(t, ep, false, 1, 0)
	ctx := context.Background()
	suffix := randomHex(4)
	effects, dedup := "sqs_hb_effects_"+suffix, "sqs_hb_processed_"+suffix
	store, err := postgres.Open(ctx, pg, postgres.WithTable(dedup))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.Pool().Exec(ctx, `CREATE TABLE `+effects+` (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Pool().Exec(context.Background(), `DROP TABLE IF EXISTS `+effects+`, `+dedup) })

	m := msgs("nohb", 1)[0]
	if err := publisher(t, ep, q).Publish(ctx, "", m); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	var mu sync.Mutex
	var decided []string // attempt:decision, in decision order
	record := core.DecisionFunc(func(ctx context.Context, m *core.Message, out core.Outcome) {
		mu.Lock()
		decided = append(decided, fmt.Sprintf("%d:%s", m.Attempt, out.Decision))
		mu.Unlock()
	})
	h := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		calls.Add(1)
		time.Sleep(2500 * time.Millisecond) // 2.5 visibility timeouts, no heartbeat
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (id) VALUES ($1)`, m.ID)
		return err
	}
	var runs []*running[pgx.Tx]
	for range 2 {
		s := open(t, ep, q, WithDeadLetterQueue(q.name), WithHeartbeat(false))
		runs = append(runs, runConsumer(t, s, driver.Store[pgx.Tx](store), h, core.WithObserver(record)))
	}
	servicetest.WaitFor(t, 20*time.Second, "one Processed and one Duplicate", func() bool {
		var p, d int64
		for _, r := range runs {
			p += r.c.Stats().Processed
			d += r.c.Stats().Duplicates
		}
		return p == 1 && d >= 1
	})
	for _, r := range runs {
		r.shutdown(t)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("decisions (attempt:decision): %v", decided)
	// The copies' claims wait on the first one's and are decided when it
	// commits, so which middleware records first after that commit is a
	// race; what must hold is one processed (the first delivery) and every
	// redelivered copy a duplicate.
	processed := 0
	for _, d := range decided {
		switch {
		case d == "1:processed":
			processed++
		case !strings.HasSuffix(d, ":duplicate") || strings.HasPrefix(d, "1:"):
			t.Errorf("decision %s in %v: want only the first delivery processed and the copies duplicate", d, decided)
		}
	}
	if processed != 1 || !slices.Contains(decided, "2:duplicate") {
		t.Errorf("decisions %v: want 1:processed once and the redelivered copy (attempt 2) as duplicate", decided)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1 (the copy's claim waits for the first commit)", n)
	}
	var n int
	if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+effects).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
}

// TestRedriveToDeadLetterQueueAfterMaxReceives leaves parking to SQS: a
// handler that keeps failing transiently is retried until the queue's
// redrive policy moves the message to the DLQ after maxReceiveCount
// receives; with DeadLetterRedrive a permanent failure goes the same way.
func TestRedriveToDeadLetterQueueAfterMaxReceives(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"transient-retries", "permanent-DeadLetterRedrive"} {
		t.Run(mode, func(t *testing.T) {
			ep := sqsEndpoint(t)
			const maxReceives = 3
			q, dlq := newQueueWithDLQ(t, ep, false, 2, maxReceives)
			st := sqliteStore(t)
			m := msgs("redrive", 1)[0]
			keep := msgs("keep", 1)[0]
			publish(t, ep, q, m, keep)
			var calls atomic.Int32
			h := func(ctx context.Context, tx *sql.Tx, got *core.Message) error {
				if got.ID != m.ID {
					return st.apply(ctx, tx, got)
				}
				calls.Add(1)
				if mode == "transient-retries" {
					return errors.New("downstream unavailable")
				}
				return core.Permanent(errors.New("malformed order"))
			}
			opts := []Option{}
			if mode != "transient-retries" {
				opts = append(opts, WithDeadLetterMode(DeadLetterRedrive))
			}
			s := open(t, ep, q, opts...)
			r := runConsumer(t, s, st.Store, h, core.WithMaxAttempts(100), core.WithBackoff(core.ConstantBackoff(0)))
			var parked []string
			servicetest.WaitFor(t, 20*time.Second, "the message in the DLQ", func() bool {
				for _, dm := range drain(t, ep, dlq.url) {
					parked = append(parked, attr(dm, DefaultIDAttribute))
				}
				return len(parked) > 0
			})
			r.shutdown(t)
			if !slices.Equal(parked, []string{m.ID}) {
				t.Errorf("DLQ holds %v, want [%s]", parked, m.ID)
			}
			if n := calls.Load(); n != maxReceives {
				t.Errorf("handler ran %d times, want maxReceiveCount = %d", n, maxReceives)
			}
			if st.count(t, m.ID) != 0 || st.count(t, keep.ID) != 1 {
				t.Errorf("effects: parked %d (want 0), other %d (want 1)", st.count(t, m.ID), st.count(t, keep.ID))
			}
		})
	}
}

// TestFIFOOrderPerGroup publishes three groups of ordered messages to a
// FIFO queue and consumes them with concurrent batches; one message fails
// once. Each group's effects must commit in publish order, and the
// publisher's deduplication id (the business id) drops a resend.
func TestFIFOOrderPerGroup(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, true, 5, 0)
	st := sqliteStore(t)
	const groups, per = 3, 12
	var all []*driver.Message
	for g := range groups {
		for i := range per {
			all = append(all, &driver.Message{
				ID:   fmt.Sprintf("g%d-%02d", g, i),
				Key:  fmt.Sprintf("group-%d", g),
				Body: fmt.Appendf(nil, `{"group":%d,"seq":%d}`, g, i),
			})
		}
	}
	// Interleave the groups as a producer would.
	slices.SortStableFunc(all, func(a, b *driver.Message) int { return strings.Compare(a.ID[3:], b.ID[3:]) })
	pub := publisher(t, ep, q)
	if err := pub.Publish(context.Background(), "", all...); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), "", all[4]); err != nil { // a resend within the dedup window
		t.Fatal(err)
	}
	var failed atomic.Bool
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if m.ID == "g1-00" && !failed.Swap(true) {
			return errors.New("transient failure at the head of group 1")
		}
		return st.apply(ctx, tx, m)
	}
	s := open(t, ep, q, WithDeadLetterQueue(dlq.url))
	r := runConsumer(t, s, st.Store, h, core.WithBatchSize(5), core.WithConcurrency(3), core.WithWindow(30),
		core.WithBackoff(core.ConstantBackoff(0)))
	servicetest.WaitFor(t, 30*time.Second, "every message processed", func() bool { return r.c.Stats().Processed == groups*per })
	r.shutdown(t)
	if !failed.Load() {
		t.Fatal("the failing message never ran")
	}
	order := st.order(t)
	for g := range groups {
		var seq []string
		for _, id := range order {
			if strings.HasPrefix(id, fmt.Sprintf("g%d-", g)) {
				seq = append(seq, id)
			}
		}
		want := make([]string, per)
		for i := range want {
			want[i] = fmt.Sprintf("g%d-%02d", g, i)
		}
		if !slices.Equal(seq, want) {
			t.Errorf("group %d committed in order %v, want %v", g, seq, want)
		}
	}
	if d := r.c.Stats().Duplicates; d != 0 {
		t.Errorf("%d duplicates reached the consumer; the FIFO deduplication id should have dropped the resend", d)
	}
	t.Logf("consumer %+v, source %+v", r.c.Stats(), s.Stats())
}

// --- pipeline helpers -------------------------------------------------

// effectStore is a SQLite dedup store plus an effects table whose rowid
// records commit order.
type effectStore struct {
	*sqlite.Store
}

func sqliteStore(t testing.TB) *effectStore {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "sqs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.DB().Exec(`CREATE TABLE effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &effectStore{st}
}

func (e *effectStore) apply(ctx context.Context, tx *sql.Tx, m *core.Message) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, m.ID)
	return err
}

func (e *effectStore) count(t testing.TB, id string) int {
	t.Helper()
	var n int
	if err := e.DB().QueryRow(`SELECT count(*) FROM effects WHERE id = ?`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *effectStore) order(t testing.TB) []string {
	t.Helper()
	rows, err := e.DB().Query(`SELECT id FROM effects ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		rows.Scan(&id)
		out = append(out, id)
	}
	return out
}

type running[Tx any] struct {
	c    *core.Consumer[Tx]
	stop context.CancelFunc
	done chan error
	once sync.Once
}

func runConsumer[Tx any](t testing.TB, src driver.Source, store driver.Store[Tx], h core.Handler[Tx], opts ...core.Option) *running[Tx] {
	t.Helper()
	base := []core.Option{
		core.WithName("sqs-test"),
		core.WithBackoff(core.ConstantBackoff(100 * time.Millisecond)),
		core.WithShutdownTimeout(10 * time.Second),
		core.WithLogger(testLogger(t)),
	}
	c, err := core.New(src, store, h, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running[Tx]{c: c, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.shutdown(t) })
	return r
}

func (r *running[Tx]) shutdown(t testing.TB) {
	r.once.Do(func() {
		r.stop()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(40 * time.Second):
			t.Error("Run did not return within 40s of cancellation")
		}
	})
}

// TestFIFOHoldBackAndRelease drives the per-group hold-back directly. AWS
// may return several messages of one group in one ReceiveMessage call
// (fauxqs returns one per group), so the test hands the Source three real
// messages of one group as if they came in one call: only the first is
// delivered; acking it delivers the second; retrying the second releases
// the third back to the queue at once, so SQS delivers it after the retried
// one instead of the consumer running it early.
func TestFIFOHoldBackAndRelease(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, _ := newQueueWithDLQ(t, ep, false, 30, 0)
	ms := msgs("hold", 3)
	publish(t, ep, q, ms...)
	s := open(t, ep, q, WithDeadLetterQueue(q.name))
	s.q.fifo = true // group handling as on a FIFO queue
	r := receiver(t, s, 0)
	raw := drainNoDelete(t, ep, q.url, 3)
	slices.SortFunc(raw, func(a, b types.Message) int {
		return strings.Compare(attr(a, DefaultIDAttribute), attr(b, DefaultIDAttribute))
	})
	for i := range raw {
		raw[i].Attributes["MessageGroupId"] = "g"
	}
	s.mu.Lock()
	s.readyLocked(s.acceptLocked(raw, time.Now()))
	s.mu.Unlock()

	d1 := receiveOne(t, r, time.Second)
	if d1.Message().ID != ms[0].ID || d1.Message().Key != "g" {
		t.Fatalf("first delivery %q key %q, want %q key g", d1.Message().ID, d1.Message().Key, ms[0].ID)
	}
	quiet(t, r, 300*time.Millisecond) // the rest of the group waits
	s.busy.Wait()                     // and no poll quiet started takes the message released below
	if err := d1.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	d2 := receiveOne(t, r, time.Second)
	if d2.Message().ID != ms[1].ID {
		t.Fatalf("after the ack got %q, want %q", d2.Message().ID, ms[1].ID)
	}
	if err := d2.Retry(context.Background(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats(); got.HeldBack != 2 || got.Released != 1 {
		t.Errorf("stats %+v: want HeldBack 2, Released 1", got)
	}
	back := drainNoDelete(t, ep, q.url, 1)
	if len(back) != 1 || attr(back[0], DefaultIDAttribute) != ms[2].ID {
		t.Errorf("visible after the retry: %d messages, want the released %q", len(back), ms[2].ID)
	}
	s.mu.Lock()
	held := s.heldBack + len(s.ready) + len(s.groups)
	s.mu.Unlock()
	if held != 0 || r.Held() != 0 {
		t.Errorf("%d messages still held back and %d unsettled after every delivery was settled or released", held, r.Held())
	}
}

// TestFIFOHeldBackRenewedWithItsGroup: a message held back behind its
// group's is renewed with it. While the first is held for over two
// visibility timeouts, another consumer receives neither; the second is
// handed out once the first is acked, and its Ack is no stale one.
func TestFIFOHeldBackRenewedWithItsGroup(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, _ := newQueueWithDLQ(t, ep, false, 2, 0)
	ms := msgs("renew", 2)
	publish(t, ep, q, ms...)
	s := open(t, ep, q, WithDeadLetterQueue(q.name))
	s.q.fifo = true // group handling as on a FIFO queue
	r := receiver(t, s, 0)
	raw := drainNoDelete(t, ep, q.url, 2)
	slices.SortFunc(raw, func(a, b types.Message) int {
		return strings.Compare(attr(a, DefaultIDAttribute), attr(b, DefaultIDAttribute))
	})
	for i := range raw {
		raw[i].Attributes["MessageGroupId"] = "g"
	}
	s.mu.Lock()
	s.readyLocked(s.acceptLocked(raw, time.Now()))
	s.mu.Unlock()
	d1 := receiveOne(t, r, time.Second)
	if got := drainNoDelete(t, ep, q.url, 1); len(got) != 0 { // receives for 5s
		t.Fatalf("another consumer received %q while its group's first was held", attr(got[0], DefaultIDAttribute))
	}
	if err := d1.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	d2 := receiveOne(t, r, time.Second)
	if d2.Message().ID != ms[1].ID {
		t.Fatalf("after the ack got %q, want %q", d2.Message().ID, ms[1].ID)
	}
	if err := d2.Ack(context.Background()); err != nil {
		t.Fatalf("Ack of the message held back: %v", err)
	}
	if vis, inflight := queueCounts(t, ep, q.url); vis+inflight != 0 {
		t.Errorf("queue holds %d+%d messages after both acks, want none", vis, inflight)
	}
	if st := s.Stats(); st.Extended < 4 || st.HeartbeatFailures != 0 {
		t.Errorf("stats %+v: want both messages extended at least twice, no failure", st)
	}
}

// drainNoDelete receives n messages with a raw client, leaving them in
// flight.
func drainNoDelete(t testing.TB, ep, url string, n int) []types.Message {
	t.Helper()
	cl := testClient(ep)
	var out []types.Message
	deadline := time.Now().Add(5 * time.Second)
	for len(out) < n && time.Now().Before(deadline) {
		r, err := cl.ReceiveMessage(context.Background(), &awssqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: int32(n - len(out)), WaitTimeSeconds: 1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r.Messages...)
	}
	return out
}

// TestOpenByURL opens a Source and a Publisher through core's registry.
func TestOpenByURL(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, false, 5, 0)
	ctx := context.Background()
	base := "sqs://test:test@" + q.name + "?endpoint=" + ep + "&region=us-east-1"
	pub, err := core.OpenPublisher(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	m := msgs("url", 1)[0]
	if err := pub.Driver().Publish(ctx, "", m); err != nil {
		t.Fatal(err)
	}
	src, err := core.OpenSource(ctx, base+"&dlq="+dlq.name+"&wait=1s&receivers=1&heartbeat=true&max_extension=1m&close_timeout=2s&dead_letter_mode=send")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s := src.(*Source)
	if s.cfg.receivers != 1 || s.cfg.waitTime != time.Second || s.dlq.name != dlq.name {
		t.Errorf("URL parameters not applied: %+v", s.cfg)
	}
	r := receiver(t, s, 0)
	if tr := r.Traits(); tr.Receivers != 1 || tr.MaxExtension != time.Minute || tr.MaxBatch != 10 || !tr.DelaysRetry {
		t.Errorf("Traits %+v, want 1 receiver, a 1m maximum extension, batches of 10, retries delayed by SQS", tr)
	}
	d := receiveOne(t, r, 10*time.Second)
	if d.Message().ID != m.ID {
		t.Errorf("got %q, want %q", d.Message().ID, m.ID)
	}
	d.Ack(ctx)
	for _, bad := range []struct{ url, want string }{
		{base + "&bogus=1", `unknown parameter "bogus"`},
		{base + "&window=3", `unknown parameter "window"`}, // the Consumer's WithWindow is the window
		{base + "&dead_letter_mode=drop", "dead_letter_mode"},
		{"sqs://", "no queue"},
		{"sqs://keyonly@" + q.name + "?endpoint=" + ep, "secret"},
	} {
		_, err := core.OpenSource(ctx, bad.url)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("OpenSource(%s) = %v, want an error about %s", bad.url, err, bad.want)
		}
	}
	// The consumer's URL serves the publisher too: the Source's own
	// parameters are checked and ignored.
	pub, err = core.OpenPublisher(ctx, base+"&receivers=3&wait=1s&dlq=x&visibility=5s")
	if err != nil {
		t.Errorf("a consumer's URL for a publisher: %v", err)
	} else {
		pub.Close()
	}
	_, err = core.OpenPublisher(ctx, base+"&receivers=x")
	if err == nil || !strings.Contains(err.Error(), "receivers") {
		t.Errorf("a bad consumer parameter on a publisher URL: %v", err)
	}
	if err == nil || strings.Contains(err.Error(), "test:test") {
		t.Errorf("the error shows the secret: %v", err)
	}
}

// TestSettlementFailuresAreReported makes SQS refuse settlements: an
// extension of a message deleted behind the Source's back fails for good
// (its receipt handle is gone, so the heartbeat stops extending it and
// its settlement is stale), and when the queue itself is gone every
// delete is retried WithSettleRetries times and then reported for every
// message, none dropped silently.
func TestSettlementFailuresAreReported(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, _ := newQueueWithDLQ(t, ep, false, 2, 0)
	publish(t, ep, q, msgs("refused", 4)...)
	s := open(t, ep, q, WithDeadLetterQueue(q.url), WithSettleRetries(2))
	r := receiver(t, s, 0)
	var ds []*brokertest.Delivery
	for range 4 {
		ds = append(ds, receiveOne(t, r, 10*time.Second))
	}
	cl := testClient(ep)
	gone := ds[0].Message().AckID.(*delivery)
	if _, err := cl.DeleteMessage(context.Background(), &awssqs.DeleteMessageInput{QueueUrl: aws.String(q.url), ReceiptHandle: gone.raw.ReceiptHandle}); err != nil {
		t.Fatal(err)
	}
	servicetest.WaitFor(t, 10*time.Second, "the heartbeat to fail on the deleted message", func() bool {
		return s.Stats().HeartbeatFailures > 0
	})
	before := s.Stats().Extended
	time.Sleep(1500 * time.Millisecond)
	if s.Stats().Extended <= before {
		t.Error("the heartbeat stopped extending the other messages")
	}
	if f := s.Stats().HeartbeatFailures; f != 1 {
		t.Errorf("HeartbeatFailures = %d, want 1 (ReceiptHandleIsInvalid is final)", f)
	}
	if err := ds[0].Ack(context.Background()); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Errorf("Ack of the message deleted behind the Source's back = %v, want a stale delivery", err)
	}

	if _, err := cl.DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: aws.String(q.url)}); err != nil {
		t.Fatal(err)
	}
	err := r.AckBatch(context.Background(), ds[1:])
	if err == nil {
		t.Fatal("AckBatch on a deleted queue returned nil")
	}
	for _, d := range ds[1:] {
		if !strings.Contains(err.Error(), d.Message().ID) {
			t.Errorf("AckBatch error does not name %s: %v", d.Message().ID, err)
		}
	}
	if r := s.Stats().SettleRetries; r != 3*2 {
		t.Errorf("SettleRetries = %d, want 3 messages x 2 retries", r)
	}
	if err := ds[1].Ack(context.Background()); !errors.Is(err, driver.ErrAlreadySettled) {
		t.Errorf("Ack after a failed AckBatch = %v, want ErrAlreadySettled (the broker redelivers it)", err)
	}
}

// TestFIFODeadLetter parks a FIFO message in a FIFO dead-letter queue: the
// copy keeps its group and carries the cause, source queue and attempt.
func TestFIFODeadLetter(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, true, 5, 0)
	m := &driver.Message{ID: "fifo-dl-" + randomHex(4), Key: "customer-9", Body: []byte(`{"x":1}`)}
	publish(t, ep, q, m)
	s := open(t, ep, q, WithDeadLetterQueue(dlq.name))
	d := receiveOne(t, receiver(t, s, 0), 10*time.Second)
	if d.Message().Key != m.Key {
		t.Errorf("Key = %q, want the group %q", d.Message().Key, m.Key)
	}
	if err := d.DeadLetter(context.Background(), core.Permanent(errors.New("bad total"))); err != nil {
		t.Fatal(err)
	}
	var parked []types.Message
	servicetest.WaitFor(t, 5*time.Second, "the dead letter", func() bool {
		parked = append(parked, drain(t, ep, dlq.url)...)
		return len(parked) > 0
	})
	p := parked[0]
	if attr(p, DefaultIDAttribute) != m.ID || !strings.Contains(attr(p, driver.CauseHeader), "bad total") ||
		attr(p, driver.OriginHeader) != q.name || attr(p, driver.AttemptHeader) != "1" {
		t.Errorf("parked copy attributes: %v", p.MessageAttributes)
	}
	if g := p.Attributes["MessageGroupId"]; g != m.Key {
		t.Errorf("parked copy group %q, want %q", g, m.Key)
	}
	if s.Stats().DeadLettered != 1 {
		t.Errorf("DeadLettered = %d", s.Stats().DeadLettered)
	}
	if vis, inflight := queueCounts(t, ep, q.url); vis+inflight != 0 {
		t.Errorf("the original is still in the queue: %d+%d", vis, inflight)
	}
}
