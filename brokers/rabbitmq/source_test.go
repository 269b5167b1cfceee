package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

func TestOptionErrorsNameTheField(t *testing.T) {
	ctx := context.Background()
	const url = "amqp://guest:guest@127.0.0.1:5672/"
	cases := []struct {
		name  string
		queue string
		url   string
		opt   Option
		want  string
	}{
		{"queue type", "q", url, WithQueueType("stream"), "WithQueueType"},
		{"dlq", "q", url, WithDeadLetterQueue(""), "WithDeadLetterQueue"},
		{"retry queue", "q", url, WithRetryQueue(strings.Repeat("x", 256)), "WithRetryQueue"},
		{"retry mode", "q", url, WithRetryMode(9), "WithRetryMode"},
		{"dead-letter mode", "q", url, WithDeadLetterMode(9), "WithDeadLetterMode"},
		{"backoff", "q", url, WithReconnectBackoff(time.Second, time.Millisecond), "WithReconnectBackoff"},
		{"logger", "q", url, WithLogger(nil), "WithLogger"},
		{"connection name", "q", url, WithConnectionName(""), "WithConnectionName"},
		{"dial recovery", "q", url, WithDialConfig(amqp.Config{Recovery: &amqp.Recovery{}}), "Recovery"},
		{"empty queue", "", url, WithDeclare(true), "queue"},
		{"bad url", "q", "http://x", WithDeclare(true), "url"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Open(ctx, c.url, WithQueue(c.queue), c.opt)
			if err == nil {
				s.Close()
				t.Fatal("Open accepted an invalid option")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not name %q", err, c.want)
			}
		})
	}
	if _, err := NewPublisher(ctx, url, WithPublishExchange(strings.Repeat("e", 300))); err == nil || !strings.Contains(err.Error(), "WithPublishExchange") {
		t.Errorf("NewPublisher with a long exchange: %v", err)
	}
	if _, err := NewPublisher(ctx, url, WithPublisherDialConfig(amqp.Config{Recovery: &amqp.Recovery{}})); err == nil || !strings.Contains(err.Error(), "Recovery") {
		t.Errorf("NewPublisher with Recovery: %v", err)
	}
}

func TestOpenWithoutDeclareNeedsTheQueues(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	ctx := context.Background()
	_, err := Open(ctx, url, WithQueue(q), WithDeclare(false))
	if err == nil || !strings.Contains(err.Error(), q) {
		t.Fatalf("Open(WithDeclare(false)) on a missing queue = %v, want an error naming %q", err, q)
	}
	// Declared by a first Open, the second finds it.
	s, err := Open(ctx, url, WithQueue(q))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(ctx, url, WithQueue(q), WithDeclare(false))
	if err != nil {
		t.Fatalf("Open(WithDeclare(false)) on an existing topology: %v", err)
	}
	s.Close()
}

func TestMessageFieldsFromAMQP(t *testing.T) {
	url, q, _, r := openTestSource(t)
	ctx := context.Background()
	ch := testChannel(t, url)
	when := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	err := ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{
		MessageId: "order-42",
		Body:      []byte("hello"),
		Headers: amqp.Table{
			"traceparent": "00-abc-def-01",
			"n":           int32(7),
			"big":         int64(1 << 40),
			"flag":        true,
			"raw":         []byte("bytes"),
			"when":        when,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{Body: []byte("anonymous")}); err != nil {
		t.Fatal(err)
	}
	ds := receiveN(t, r, 2, 10*time.Second)
	m := ds[0].Message()
	want := map[string]string{"traceparent": "00-abc-def-01", "n": "7", "big": "1099511627776", "flag": "true", "raw": "bytes", "when": "2026-01-02T03:04:05Z"}
	for k, v := range want {
		if m.Headers[k] != v {
			t.Errorf("header %s = %q, want %q", k, m.Headers[k], v)
		}
	}
	if m.ID != "order-42" || string(m.Body) != "hello" || m.System != "rabbitmq" || m.Source != q || m.Attempt != 1 {
		t.Errorf("message = %+v", m)
	}
	if got := driver.MetadataOf(m.Metadata)["messaging.rabbitmq.destination.routing_key"]; got != q {
		t.Errorf("routing key metadata = %q, want %q", got, q)
	}
	if got := driver.MetadataOf(m.Metadata)["messaging.destination.name"]; got != "amq.default" {
		t.Errorf("destination metadata = %q, want amq.default", got)
	}
	if got := driver.MetadataOf(m.Metadata)["messaging.rabbitmq.message.delivery_tag"]; got != "1" {
		t.Errorf("delivery tag metadata = %q, want 1", got)
	}
	if id := ds[1].Message().ID; id != "" {
		t.Errorf("a message without message_id has ID %q, want empty (the core dead-letters it)", id)
	}
	for _, d := range ds {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// On a classic queue the broker only flags a redelivery; the Source
// remembers the attempts of messages it requeued so MaxAttempts works.
func TestClassicRequeueAttemptsGrow(t *testing.T) {
	url, q, _, r := openTestSource(t)
	ctx := context.Background()
	publishN(t, url, q, "grow", 1)
	for want := 1; want <= 4; want++ {
		d := receiveN(t, r, 1, 10*time.Second)[0]
		if d.Message().Attempt != want {
			t.Fatalf("Attempt = %d, want %d", d.Message().Attempt, want)
		}
		if want == 4 {
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			break
		}
		if err := d.Retry(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// Batches decided by several workers commit out of tag order: the acks of
// the later batch wait for the earlier one, and one multiple ack covers
// both; acks whose lower neighbour stays in flight go out one by one
// after ackDelay.
func TestOutOfOrderBatchesShareOneMultipleAck(t *testing.T) {
	url, q, src, r := openTestSource(t)
	ctx := context.Background()
	publishN(t, url, q, "ooo", 12)
	ds := receiveN(t, r, 12, 10*time.Second)
	src.ackDelay.Store(int64(time.Minute)) // the first acks wait for the second batch, however slow the machine
	if err := r.AckBatch(ctx, ds[6:]); err != nil {
		t.Fatal(err)
	}
	if err := r.AckBatch(ctx, ds[:6]); err != nil {
		t.Fatal(err)
	}
	if st := src.Stats(); st.MultipleAcks != 1 || st.MultipleAcked != 12 {
		t.Fatalf("stats %+v: want one multiple ack of 12", st)
	}
	src.ackDelay.Store(int64(ackDelay))
	publishN(t, url, q, "held", 4)
	more := receiveN(t, r, 4, 10*time.Second)
	if err := r.AckBatch(ctx, more[1:]); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, func() bool {
		src.mu.Lock()
		sess := src.sess
		src.mu.Unlock()
		sess.mu.Lock()
		defer sess.mu.Unlock()
		return len(sess.deferred) == 0
	})
	if st := src.Stats(); st.MultipleAcks != 1 {
		t.Fatalf("stats %+v: a multiple ack was sent over an in-flight tag", st)
	}
	closeLeavingOnly(t, r, url, q, more[0].Message().ID)
}

func TestAckBatchUsesMultipleOnlyOverASafeRun(t *testing.T) {
	url, q, src, r := openTestSource(t)
	ctx := context.Background()
	publishN(t, url, q, "multi", 12)
	ds := receiveN(t, r, 12, 10*time.Second)
	// First six, nothing below them outstanding: one multiple ack.
	if err := r.AckBatch(ctx, ds[:6]); err != nil {
		t.Fatal(err)
	}
	if st := src.Stats(); st.MultipleAcks != 1 || st.MultipleAcked != 6 {
		t.Fatalf("stats %+v: want one multiple ack of 6", st)
	}
	// Tags 8..12 while 7 is in flight: a multiple ack would take 7 too.
	if err := r.AckBatch(ctx, ds[7:]); err != nil {
		t.Fatal(err)
	}
	if st := src.Stats(); st.MultipleAcks != 1 {
		t.Fatalf("stats %+v: a multiple ack was sent over an in-flight tag", st)
	}
	closeLeavingOnly(t, r, url, q, ds[6].Message().ID)
}

func TestDeadLetterKeepsTheMessageWhenTheDLQIsGone(t *testing.T) {
	url, q, _, r := openTestSource(t)
	ctx := context.Background()
	publishN(t, url, q, "nodlq", 1)
	ch := testChannel(t, url)
	if _, err := ch.QueueDelete(q+".dlq", false, false, false); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, r, 1, 10*time.Second)[0]
	err := d.DeadLetter(ctx, errors.New("poison"))
	if err == nil || !strings.Contains(err.Error(), "unroutable") {
		t.Fatalf("DeadLetter without a DLQ = %v, want an unroutable error", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if n := queueDepth(t, url, q); n != 1 {
		t.Fatalf("queue depth %d after a failed dead-letter, want the message back (1)", n)
	}
}

// TestPublisherNackIsNotPermanent: a message the broker nacks (a full
// queue that rejects publishes) fails Publish with an error not marked
// permanent: the queue may drain.
func TestPublisherNackIsNotPermanent(t *testing.T) {
	url := amqpURL(t)
	ctx := context.Background()
	q := uniqueQueue(t, url)
	if _, err := testChannel(t, url).QueueDeclare(q, true, false, false, false,
		amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	pub, err := NewPublisher(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	err = pub.Publish(ctx, q, &driver.Message{ID: "a", Body: []byte("x")})
	if err == nil || !strings.Contains(err.Error(), "not confirmed") || core.IsPermanent(err) {
		t.Fatalf("Publish to a full queue = %v, want a nack not marked permanent", err)
	}
}

func TestPublisherReportsUnroutable(t *testing.T) {
	url := amqpURL(t)
	ctx := context.Background()
	pub, err := NewPublisher(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	err = pub.Publish(ctx, "idemq-no-such-queue-"+fmt.Sprint(time.Now().UnixNano()), &driver.Message{ID: "a", Body: []byte("x")})
	if err == nil || !strings.Contains(err.Error(), "unroutable") || !strings.Contains(err.Error(), "NO_ROUTE") || !core.IsPermanent(err) {
		t.Fatalf("Publish to a missing queue = %v, want unroutable (NO_ROUTE), marked permanent", err)
	}
	// The publisher stays usable.
	q := uniqueQueue(t, url)
	s, err := Open(ctx, url, WithQueue(q))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := pub.Publish(ctx, q, &driver.Message{ID: "b", Body: []byte("y")}); err != nil {
		t.Fatalf("Publish after an unroutable one: %v", err)
	}
	got := drainQueue(t, url, q)
	if len(got) != 1 || got[0].MessageId != "b" || got[0].DeliveryMode != amqp.Persistent {
		t.Fatalf("queue holds %+v, want one persistent message b", got)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, q, &driver.Message{ID: "c"}); err == nil {
		t.Error("Publish after Close returned nil")
	}
}

func TestCloseUnblocksReceive(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	src, err := Open(context.Background(), url, WithQueue(q))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Start(context.Background(), driver.Setup{Window: 1, Logger: testLogger(t)}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := src.Receive(context.Background(), 1)
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, core.ErrSourceClosed) {
			t.Fatalf("Receive = %v, want core.ErrSourceClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Receive still blocked after Close")
	}
}

// The options a user sees in the broker's own listings do what they say:
// WithPublisherConnectionName names the publisher's connection,
// WithMandatory(false) lets the broker drop an unroutable message instead
// of failing Publish, and WithConsumerTag tags the Source's consumer.
func TestPublisherAndConsumerOptionsSeenByTheBroker(t *testing.T) {
	url := amqpURL(t)
	needRabbitmqctl(t, url)
	ctx := context.Background()
	q := uniqueQueue(t, url)
	name := "idemq-test-pub-" + q
	pub, err := NewPublisher(ctx, url, WithMandatory(false), WithPublisherConnectionName(name))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(ctx, "idemq-no-such-queue-"+q, &driver.Message{ID: "a", Body: []byte("x")}); err != nil {
		t.Fatalf("Publish of an unroutable message without mandatory = %v, want nil (the broker drops it)", err)
	}
	if n := len(connectionsNamed(t, name)); n != 1 {
		t.Fatalf("%d connections named %s, want the publisher's one", n, name)
	}

	tag := "idemq-test-tag-" + q
	src, err := Open(ctx, url, WithQueue(q), WithConsumerTag(tag), WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, src, 0)
	publishN(t, url, q, "tagged", 1)
	receiveN(t, r, 1, 10*time.Second)
	tags, err := consumersOf(q, "consumer_tag")
	if err != nil {
		t.Fatal(err)
	}
	if len(tags) == 0 || slices.ContainsFunc(tags, func(got string) bool { return got != tag }) {
		t.Fatalf("consumers of %s tagged %q, want each tagged %q", q, tags, tag)
	}
}

// TestBrokerClosesConnection has the broker itself close the Source's
// connection (rabbitmqctl close_connection, CONNECTION_FORCED) while
// deliveries are in flight, as an operator or a node restart would.
func TestBrokerClosesConnection(t *testing.T) {
	url := amqpURL(t)
	needRabbitmqctl(t, url)
	q := uniqueQueue(t, url)
	name := "idemq-test-" + q
	ctx := context.Background()
	src, err := Open(ctx, url, WithQueue(q), WithConnectionName(name), WithLogger(testLogger(t)), WithReconnectBackoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, src, 0)
	publishN(t, url, q, "forced", 20)
	ds := receiveN(t, r, 5, 10*time.Second)
	if closed := closeConnectionNamed(t, name); closed != 1 {
		t.Fatalf("found %d connections named %s", closed, name)
	}
	waitUntil(t, 10*time.Second, func() bool { return src.Stats().Reconnects == 1 })
	for _, d := range ds {
		if err := d.Ack(ctx); !errors.Is(err, core.ErrStaleDelivery) {
			t.Fatalf("Ack after the broker closed the connection = %v, want core.ErrStaleDelivery", err)
		}
	}
	seen := map[string]bool{}
	for len(seen) < 20 {
		d := receiveN(t, r, 1, 10*time.Second)[0]
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		seen[d.Message().ID] = true
	}
	if st := src.Stats(); st.Reconnects != 1 {
		t.Errorf("Reconnects = %d, want 1", st.Reconnects)
	}
}

// The QoS prefetch is the Consumer's window: started with a window of 7,
// the Source gets 7 unsettled messages from the broker and no more,
// however many Receive asks for. A window below 1 is refused, one above
// AMQP's limit is declared as 65535.
func TestPrefetchIsTheWindow(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	ctx := context.Background()
	open := func() *Source {
		src, err := Open(ctx, url, WithQueue(q), WithLogger(testLogger(t)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() })
		return src
	}
	src := open()
	if _, err := src.Start(ctx, driver.Setup{Window: 0}); err == nil {
		t.Error("a window of 0 was accepted")
	}
	if _, err := src.Start(ctx, driver.Setup{Window: 7}); err != nil {
		t.Fatal(err)
	}
	publishN(t, url, q, "prefetch", 20)
	got := 0
	for {
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		ms, err := src.Receive(rctx, 100)
		cancel()
		if err != nil {
			if rctx.Err() == nil {
				t.Fatal(err)
			}
			break
		}
		got += len(ms)
	}
	if got != 7 {
		t.Errorf("received %d unsettled messages with a window of 7, want 7", got)
	}
	src.Close()

	src = open()
	if _, err := src.Start(ctx, driver.Setup{Window: 70000}); err != nil {
		t.Fatalf("a window of 70000: %v", err)
	}
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Skip("rabbitmqctl not in PATH: the prefetch of a window above 65535 is not checked")
	}
	var prefetch []string
	waitUntil(t, 10*time.Second, func() bool {
		var err error
		if prefetch, err = consumersOf(q, "prefetch_count"); err != nil {
			servicetest.Unavailable(t, "%v", err)
		}
		return len(prefetch) == 1
	})
	if prefetch[0] != "65535" {
		t.Errorf("a window of 70000 declared a prefetch of %s, want 65535", prefetch[0])
	}
}

// A Consumer that stops gives back what it holds (Release) without the
// broker handing it straight back: on a quorum queue, which counts every
// delivery against its delivery limit, a stop costs one delivery.
func TestStopCountsOneDelivery(t *testing.T) {
	url, q, _, r := openTestSource(t, WithQueueType(Quorum))
	publishN(t, url, q, "stop", 3)
	ds := receiveN(t, r, 3, 10*time.Second)
	if err := ds[0].Retry(context.Background(), time.Hour); err != nil { // held for its delay, given back too
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	src, err := Open(context.Background(), url, WithQueue(q), WithQueueType(Quorum), WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range receiveN(t, brokertest.StartReceiver(t, src, 0), 3, 10*time.Second) {
		if m := d.Message(); m.Attempt != 2 {
			t.Errorf("%s: Attempt %d after one stop (x-delivery-count %s), want 2", m.ID, m.Attempt, m.Headers["x-delivery-count"])
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
