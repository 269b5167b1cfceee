// Package brokertest is the conformance suite every idemq broker adapter
// runs from its own test, against its real broker.
//
// An adapter's test builds a Harness (how to get a fresh queue, publish to
// it, open consumers on it and read what was dead-lettered) and calls Run.
// The suite checks the adapter's settlement contract directly (Receive,
// Ack, Retry, DeadLetter, AckBatch, SetWindow, Close) and then runs the
// whole pipeline (core.Consumer with the SQLite store) over the adapter,
// counting committed effects per message id: a message must be applied
// exactly once, not merely "not lost".
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, brokertest.Harness{Open: func(t *testing.T) *brokertest.Fixture { ... }})
//	}
package brokertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
)

// Harness describes one adapter to the suite.
type Harness struct {
	// Open returns a fixture around a fresh, empty queue that no other
	// test uses. It registers its own cleanup (deleting the queue) with
	// t.Cleanup. Required.
	Open func(t *testing.T) *Fixture
	// RecordsCause is true when the adapter keeps the dead-letter cause
	// where Fixture.DeadLetters reads it back; the suite then checks it.
	RecordsCause bool
	// ReceiveTimeout bounds how long a message that must arrive may take.
	// Default 10s.
	ReceiveTimeout time.Duration
	// Quiet is how long the suite waits to conclude that nothing more
	// arrives. Default 500ms.
	Quiet time.Duration
	// CarriesKey is true when the broker carries Message.Key (the Kafka
	// record key, an SQS FIFO MessageGroupId); the publisher round trip
	// then checks it lands and comes back.
	CarriesKey bool
	// WindowRefillsWhole is true when the adapter takes more from the broker
	// only once every delivery it holds is settled (a Kafka share group on
	// franz-go, which accepts at each poll what the previous one left
	// unacknowledged): the window case then checks that settling part of
	// the window brings nothing more, and settling all of it does.
	WindowRefillsWhole bool
	// OperatesDeadLetters is true when the adapter registers a
	// DeadLetterQueue for its scheme (admin.RegisterDeadLetters); the
	// suite then lists, redrives and purges parked messages through
	// admin.OpenDeadLetters(Fixture.SourceURL).
	OperatesDeadLetters bool
}

// Fixture is one fresh queue of the broker under test.
type Fixture struct {
	// Publish publishes msgs to the queue and returns once the broker has
	// them (publisher confirms or the equivalent). Messages with an empty
	// ID must be published without an id. Required.
	Publish func(ctx context.Context, msgs ...*driver.Message) error
	// NewSource opens a new consumer of the queue. The suite closes it.
	// Required.
	NewSource func(t *testing.T) driver.Source
	// DeadLetters returns messages parked by DeadLetter so far. It may
	// consume them: the suite merges successive results. Required.
	DeadLetters func(ctx context.Context) ([]DeadLetter, error)
	// Reconnect makes src lose what its unsettled deliveries were received
	// on, as a broker failure would, and returns once src receives again:
	// its connection closes and it reconnects (RabbitMQ), its partitions
	// are revoked and assigned again (Kafka), its leases or visibility
	// expire (SQS, memory). Deliveries received before it are then stale.
	// Required.
	Reconnect func(t *testing.T, src driver.Source)
	// NewPublisher opens the adapter's own Publisher for the queue (Publish
	// with destination "" sends to it). The suite closes it. Required.
	NewPublisher func(t *testing.T) driver.Publisher
	// Raw takes the next message off the queue with the broker's own
	// client, bypassing the adapter's Source, and reports what the broker
	// carries where: the id in the broker's own id field (AMQP message_id,
	// the Kafka id header, the SQS id attribute), the key, the headers.
	// Required.
	Raw func(ctx context.Context) (RawMessage, error)
	// SourceURL and PublisherURL open the queue through core.OpenSource
	// and core.OpenPublisher. Required.
	SourceURL, PublisherURL string
}

// RawMessage is a message as the broker keeps it, read without the
// adapter.
type RawMessage struct {
	// ID is the business id as found in the broker's own id field.
	ID string
	// Key is the Kafka record key or SQS MessageGroupId ("" elsewhere).
	Key string
	// Headers are the AMQP headers, Kafka record headers or SQS message
	// attributes, as strings.
	Headers map[string]string
	// Body is the payload.
	Body []byte
}

// DeadLetter is one parked message as the broker keeps it.
type DeadLetter struct {
	// ID is the message's business id ("" if it had none).
	ID string
	// Body is the message body.
	Body []byte
	// Cause is the recorded cause, "" where the broker keeps none.
	Cause string
}

func (h Harness) withDefaults() Harness {
	timeoutDefaults(&h.ReceiveTimeout, &h.Quiet)
	return h
}

// timeoutDefaults sets the defaults of the ReceiveTimeout and Quiet of a
// Harness or PushHarness where they are not positive.
func timeoutDefaults(receiveTimeout, quiet *time.Duration) {
	if *receiveTimeout <= 0 {
		*receiveTimeout = 10 * time.Second
	}
	if *quiet <= 0 {
		*quiet = 500 * time.Millisecond
	}
}

// Run runs every case of the suite as a subtest of t.
func Run(t *testing.T, h Harness) {
	if h.Open == nil {
		t.Fatal("brokertest: Harness.Open is required")
	}
	h = h.withDefaults()
	cases := []struct {
		name string
		f    func(*testing.T, Harness)
	}{
		{"PublishConsume", testPublishConsume},
		{"AckRemoves", testAckRemoves},
		{"SettleTwiceFails", testSettleTwice},
		{"RetryRedeliversWithHigherAttempt", testRetry},
		{"DeadLetterParksWithCause", testDeadLetter},
		{"UnackedComeBackAfterConsumerDies", testUnackedComeBack},
		{"ConcurrentConsumersShareTheQueue", testConcurrentConsumers},
		{"GracefulCloseWithDeliveriesInFlight", testGracefulClose},
		{"AckBatchAcksExactlyTheBatch", testAckBatch},
		{"WindowBoundsDeliveries", testWindow},
		{"SettleAfterReconnectIsStale", testStaleAfterReconnect},
		{"PublisherRoundTrip", testPublisherRoundTrip},
		{"URLRefusesUnknownParameter", testURLUnknownParameter},
		{"Pipeline/MissingIDIsDeadLettered", testPipelineMissingID},
		{"Pipeline/DuplicatesApplyOnce", testPipelineDuplicates},
		{"Pipeline/FailedHandlerIsRetriedNotDropped", testPipelineRetry},
		{"Pipeline/PoisonIsDeadLetteredAfterMaxAttempts", testPipelinePoison},
		{"Pipeline/CrashBetweenCommitAndAck", testPipelineCrash},
		{"Pipeline/GracefulShutdownMidStream", testPipelineShutdown},
		{"Leased/DuplicatesCallOutOnce", testLeasedDuplicates},
		{"Leased/PermanentErrorDeadLetters", testLeasedPermanent},
		{"Leased/HungHolderIsTakenOver", testLeasedTakeOver},
	}
	if h.OperatesDeadLetters {
		cases = append(cases, deadLetterCases...)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.f(t, h) })
	}
}

// deadLetterCases are the cases Run adds when Harness.OperatesDeadLetters
// is set.
var deadLetterCases = []struct {
	name string
	f    func(*testing.T, Harness)
}{
	{"DeadLetterQueue/ListRedrivePurge", testDeadLetterQueue},
	{"Pipeline/RedriveAfterFixAppliesOnce", testPipelineRedrive},
}

// RunDeadLetters runs only the dead-letter queue cases, for a mode of the
// adapter that the rest of the suite does not fit (an SQS queue whose
// redrive policy parks every message received twice cannot pass the retry
// cases). Harness.OperatesDeadLetters is implied.
func RunDeadLetters(t *testing.T, h Harness) {
	if h.Open == nil {
		t.Fatal("brokertest: Harness.Open is required")
	}
	h = h.withDefaults()
	for _, c := range deadLetterCases {
		t.Run(c.name, func(t *testing.T) { c.f(t, h) })
	}
}

// fixture opens a fixture and checks it is complete.
func (h Harness) fixture(t *testing.T) *Fixture {
	t.Helper()
	f := h.Open(t)
	if f == nil || f.Publish == nil || f.NewSource == nil || f.DeadLetters == nil ||
		f.Reconnect == nil || f.NewPublisher == nil || f.Raw == nil || f.SourceURL == "" || f.PublisherURL == "" {
		t.Fatal("brokertest: Fixture needs Publish, NewSource, DeadLetters, Reconnect, NewPublisher, Raw, SourceURL and PublisherURL")
	}
	return f
}

// source opens a source for a Consumer, closed when the test ends unless
// a Consumer's Run closed it first.
func source(t *testing.T, f *Fixture) driver.Source {
	t.Helper()
	s := f.NewSource(t)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// receiver opens a source and drives it as a Consumer with a window of n
// (0: DefaultWindow), one message at a time.
func receiver(t *testing.T, f *Fixture, n int) *Receiver {
	t.Helper()
	return StartReceiver(t, f.NewSource(t), n)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// randomHex returns n random bytes in hex, to keep ids of different test
// runs apart.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// messages returns n messages with distinct ids, bodies and a header.
func messages(prefix string, n int) []*driver.Message {
	run := randomHex(4)
	out := make([]*driver.Message, n)
	for i := range out {
		out[i] = &driver.Message{
			ID:      fmt.Sprintf("%s-%s-%03d", prefix, run, i),
			Body:    fmt.Appendf(nil, `{"n":%d}`, i),
			Headers: map[string]string{"idemq-test": fmt.Sprintf("h%d", i)},
		}
	}
	return out
}

func publish(t *testing.T, h Harness, f *Fixture, msgs ...*driver.Message) {
	t.Helper()
	if err := f.Publish(ctxFor(t, h.ReceiveTimeout), msgs...); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// delivered publishes n new messages (see messages) to a fresh fixture,
// opens a source on it and receives them all.
func (h Harness) delivered(t *testing.T, prefix string, n int) (*Fixture, []*driver.Message, *Receiver, []*Delivery) {
	t.Helper()
	f := h.fixture(t)
	msgs := messages(prefix, n)
	publish(t, h, f, msgs...)
	s := receiver(t, f, 0)
	return f, msgs, s, receive(t, h, s, n)
}

// receive receives n deliveries within the harness' timeout. Transient
// errors are retried, as the Consumer does.
func receive(t *testing.T, h Harness, s *Receiver, n int) []*Delivery {
	t.Helper()
	ctx := ctxFor(t, h.ReceiveTimeout)
	out := make([]*Delivery, 0, n)
	for len(out) < n {
		d, err := s.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("received %d of %d deliveries within %v", len(out), n, h.ReceiveTimeout)
			}
			if errors.Is(err, driver.ErrSourceClosed) {
				t.Fatalf("source closed after %d of %d deliveries: %v", len(out), n, err)
			}
			t.Logf("receive (retrying): %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		out = append(out, d)
	}
	return out
}

// receiveExactly receives len(want) deliveries and fails unless their ids
// are exactly want (sorted); after says what came before, for the message.
func receiveExactly(t *testing.T, h Harness, s *Receiver, after string, want []string) []*Delivery {
	t.Helper()
	ds := receive(t, h, s, len(want))
	if got := ids(ds); !slices.Equal(got, want) {
		t.Fatalf("%s received %v, want exactly %v", after, got, want)
	}
	return ds
}

// closeSource closes s and fails if that fails.
func closeSource(t *testing.T, s *Receiver) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// expectQuiet fails if s delivers anything within the quiet period.
func expectQuiet(t *testing.T, h Harness, s *Receiver) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.Quiet)
	defer cancel()
	for {
		d, err := s.Receive(ctx)
		if err == nil {
			m := d.Message()
			t.Fatalf("unexpected delivery of %q (attempt %d)", m.ID, m.Attempt)
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, driver.ErrSourceClosed) {
			t.Fatalf("source closed while waiting for quiet: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ids(ds []*Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Message().ID
	}
	slices.Sort(out)
	return out
}

func msgIDs(ms []*driver.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	slices.Sort(out)
	return out
}

func ackAll(t *testing.T, ds []*Delivery) {
	t.Helper()
	for _, d := range ds {
		if err := d.Ack(context.Background()); err != nil {
			t.Fatalf("ack %q: %v", d.Message().ID, err)
		}
	}
}

// waitDeadLetters polls Fixture.DeadLetters until every id in want is
// parked, and returns all parked messages by id.
func waitDeadLetters(t *testing.T, h Harness, f *Fixture, want ...string) map[string]DeadLetter {
	t.Helper()
	got := map[string]DeadLetter{}
	deadline := time.Now().Add(h.ReceiveTimeout)
	for {
		dls, err := f.DeadLetters(context.Background())
		if err != nil {
			t.Fatalf("DeadLetters: %v", err)
		}
		for _, dl := range dls {
			got[dl.ID] = dl
		}
		missing := 0
		for _, id := range want {
			if _, ok := got[id]; !ok {
				missing++
			}
		}
		if missing == 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages not dead-lettered within %v; parked: %v", missing, len(want), h.ReceiveTimeout, keys(got))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func testPublishConsume(t *testing.T, h Harness) {
	_, msgs, s, ds := h.delivered(t, "pc", 5)
	checkFirstDeliveries(t, msgs, ds)
	ackAll(t, ds)
	expectQuiet(t, h, s)
}

// checkFirstDeliveries checks that ds are first deliveries of msgs, one
// each: body, header, Attempt 1, System, Source and ReceivedAt.
func checkFirstDeliveries(t *testing.T, msgs []*driver.Message, ds []*Delivery) {
	t.Helper()
	byID := map[string]*driver.Message{}
	for _, m := range msgs {
		byID[m.ID] = m
	}
	for _, d := range ds {
		m := d.Message()
		want, ok := byID[m.ID]
		if !ok {
			t.Fatalf("received unknown or repeated id %q", m.ID)
		}
		delete(byID, m.ID)
		if string(m.Body) != string(want.Body) {
			t.Errorf("%s: body %q, want %q", m.ID, m.Body, want.Body)
		}
		if got := m.Headers["idemq-test"]; got != want.Headers["idemq-test"] {
			t.Errorf("%s: header idemq-test = %q, want %q", m.ID, got, want.Headers["idemq-test"])
		}
		if m.Attempt != 1 {
			t.Errorf("%s: Attempt %d on first delivery, want 1", m.ID, m.Attempt)
		}
		if m.System == "" || m.Source == "" {
			t.Errorf("%s: System %q and Source %q must be set", m.ID, m.System, m.Source)
		}
		if m.ReceivedAt.IsZero() {
			t.Errorf("%s: ReceivedAt not set", m.ID)
		}
	}
}

func testAckRemoves(t *testing.T, h Harness) {
	f, _, s1, ds := h.delivered(t, "ack", 4)
	ackAll(t, ds)
	closeSource(t, s1)
	expectQuiet(t, h, receiver(t, f, 0))
}

func testSettleTwice(t *testing.T, h Harness) {
	f, _, s, ds := h.delivered(t, "twice", 1)
	d := ds[0]
	ctx := ctxFor(t, h.ReceiveTimeout)
	if err := d.Ack(ctx); err != nil {
		t.Fatalf("ack: %v", err)
	}
	if err := d.Ack(ctx); err == nil {
		t.Error("a second Ack of the same delivery returned nil")
	}
	if err := d.Retry(ctx, 0); err == nil {
		t.Error("Retry after Ack returned nil")
	}
	if err := d.DeadLetter(ctx, errors.New("late")); err == nil {
		t.Error("DeadLetter after Ack returned nil")
	}
	expectQuiet(t, h, s)
	if dls, err := f.DeadLetters(ctx); err != nil || len(dls) != 0 {
		t.Errorf("DeadLetters after a refused DeadLetter = %v, %v; want none", dls, err)
	}
}

func testRetry(t *testing.T, h Harness) {
	_, msgs, s, ds := h.delivered(t, "retry", 1)
	d1 := ds[0]
	if d1.Message().Attempt != 1 {
		t.Fatalf("first Attempt = %d, want 1", d1.Message().Attempt)
	}
	const delay = 300 * time.Millisecond
	start := time.Now()
	if err := d1.Retry(ctxFor(t, h.ReceiveTimeout), delay); err != nil {
		t.Fatalf("retry: %v", err)
	}
	d2 := receive(t, h, s, 1)[0]
	elapsed := time.Since(start)
	m := d2.Message()
	if m.ID != msgs[0].ID || string(m.Body) != string(msgs[0].Body) {
		t.Fatalf("redelivered %q %q, want %q %q", m.ID, m.Body, msgs[0].ID, msgs[0].Body)
	}
	if m.Attempt <= 1 {
		t.Errorf("redelivery Attempt = %d, want > 1", m.Attempt)
	}
	if elapsed < delay {
		t.Errorf("redelivered after %v, sooner than the %v delay", elapsed, delay)
	}
	ackAll(t, []*Delivery{d2})
	expectQuiet(t, h, s)
}

func testDeadLetter(t *testing.T, h Harness) {
	f, _, s, ds := h.delivered(t, "dl", 2)
	var parked, acked *Delivery = ds[0], ds[1]
	cause := "brokertest cause " + randomHex(4)
	if err := parked.DeadLetter(ctxFor(t, h.ReceiveTimeout), core.Permanent(errors.New(cause))); err != nil {
		t.Fatalf("dead-letter: %v", err)
	}
	ackAll(t, []*Delivery{acked})
	expectQuiet(t, h, s)
	wantParked(t, h, f, parked, acked, cause)
}

// wantParked waits until parked is dead-lettered and checks its body and
// cause, and that acked was not parked.
func wantParked(t *testing.T, h Harness, f *Fixture, parked, acked *Delivery, cause string) {
	t.Helper()
	got := waitDeadLetters(t, h, f, parked.Message().ID)
	dl := got[parked.Message().ID]
	if string(dl.Body) != string(parked.Message().Body) {
		t.Errorf("parked body %q, want %q", dl.Body, parked.Message().Body)
	}
	if h.RecordsCause && !strings.Contains(dl.Cause, cause) {
		t.Errorf("parked cause %q does not hold %q", dl.Cause, cause)
	}
	if _, ok := got[acked.Message().ID]; ok {
		t.Errorf("acked message %q was dead-lettered", acked.Message().ID)
	}
}

func testUnackedComeBack(t *testing.T, h Harness) {
	f, _, s1, first := h.delivered(t, "unacked", 3)
	// The consumer dies: closed without settling anything.
	closeSource(t, s1)
	s2 := receiver(t, f, 0)
	again := receiveExactly(t, h, s2, "after the consumer died", ids(first))
	for _, d := range again {
		if d.Message().Attempt < 2 {
			t.Errorf("%s: redelivery Attempt = %d, want >= 2", d.Message().ID, d.Message().Attempt)
		}
	}
	ackAll(t, again)
	expectQuiet(t, h, s2)
}

func testConcurrentConsumers(t *testing.T, h Harness) {
	f := h.fixture(t)
	const n = 30
	msgs := messages("conc", n)
	publish(t, h, f, msgs...)
	srcs := []*Receiver{receiver(t, f, 2), receiver(t, f, 2)}
	ctx, cancel := context.WithTimeout(context.Background(), h.ReceiveTimeout)
	defer cancel()
	var mu sync.Mutex
	seen := map[string]int{}
	per := make([]int, len(srcs))
	var total atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, len(srcs))
	for i, s := range srcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				d, err := s.Receive(ctx)
				if err != nil {
					continue
				}
				time.Sleep(2 * time.Millisecond) // some work, so both consumers get a share
				if err := d.Ack(context.Background()); err != nil {
					errc <- fmt.Errorf("ack %q: %w", d.Message().ID, err)
					cancel()
					return
				}
				mu.Lock()
				seen[d.Message().ID]++
				per[i]++
				mu.Unlock()
				if total.Add(1) == n {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if total.Load() != n {
		t.Fatalf("consumed %d of %d messages within %v", total.Load(), n, h.ReceiveTimeout)
	}
	for _, m := range msgs {
		if seen[m.ID] != 1 {
			t.Errorf("%s consumed %d times, want 1", m.ID, seen[m.ID])
		}
	}
	t.Logf("messages per consumer: %v", per)
	if per[0] == 0 || per[1] == 0 {
		t.Errorf("one consumer got nothing with a window of 2: %v", per)
	}
	expectQuiet(t, h, srcs[0])
}

func testGracefulClose(t *testing.T, h Harness) {
	f, _, s1, ds := h.delivered(t, "close", 6)
	ackAll(t, ds[:3])
	// Close with three deliveries still in flight.
	closeSource(t, s1)
	if _, err := s1.Receive(context.Background()); !errors.Is(err, driver.ErrSourceClosed) {
		t.Errorf("Receive after Close = %v, want driver.ErrSourceClosed", err)
	}
	if err := s1.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	// Settling after Close must fail: the broker has taken the messages
	// back and will redeliver them.
	if err := ds[3].Ack(ctxFor(t, h.ReceiveTimeout)); err == nil {
		t.Error("Ack of a delivery of a closed source returned nil")
	}
	s2 := receiver(t, f, 0)
	again := receiveExactly(t, h, s2, "after a close with three unsettled", ids(ds[3:]))
	ackAll(t, again)
	expectQuiet(t, h, s2)
}

func testAckBatch(t *testing.T, h Harness) {
	f := h.fixture(t)
	s1 := receiver(t, f, 0)
	msgs := messages("batch", 10)
	publish(t, h, f, msgs...)
	ds := receive(t, h, s1, len(msgs))
	// Leave the first delivery and two holes unsettled: an ack that covers
	// "everything up to the batch's last" would take them too.
	var batch, left []*Delivery
	for i, d := range ds {
		if i == 0 || i == 4 || i == 7 || i == 8 {
			left = append(left, d)
		} else {
			batch = append(batch, d)
		}
	}
	ctx := ctxFor(t, h.ReceiveTimeout)
	if err := s1.AckBatch(ctx, batch); err != nil {
		t.Fatalf("AckBatch: %v", err)
	}
	if err := s1.AckBatch(ctx, batch[:1]); err == nil {
		t.Error("AckBatch of an already acked delivery returned nil")
	}
	closeSource(t, s1)
	s2 := receiver(t, f, 0)
	again := receiveExactly(t, h, s2, "after AckBatch of the others", ids(left))
	if err := s2.AckBatch(ctx, again); err != nil {
		t.Fatalf("AckBatch: %v", err)
	}
	expectQuiet(t, h, s2)
}

func testWindow(t *testing.T, h Harness) {
	f := h.fixture(t)
	if r, err := NewReceiver(context.Background(), f.NewSource(t), 0, slog.Default()); err == nil {
		_ = r.Close()
		t.Error("a window of 0 was accepted")
	}
	s := receiver(t, f, 3)
	publish(t, h, f, messages("window", 10)...)
	ds := receive(t, h, s, 3)
	// Three unsettled: the fourth must wait.
	expectQuiet(t, h, s)
	ackAll(t, ds[:1])
	if h.WindowRefillsWhole {
		expectQuiet(t, h, s)
		ackAll(t, ds[1:])
		for _, n := range []int{3, 3, 1} {
			ds = receive(t, h, s, n)
			expectQuiet(t, h, s)
			ackAll(t, ds)
		}
		return
	}
	ds = append(ds[1:], receive(t, h, s, 1)...)
	expectQuiet(t, h, s)
	ackAll(t, ds)
	rest := receive(t, h, s, 3)
	ackAll(t, rest)
	ackAll(t, receive(t, h, s, 3))
	expectQuiet(t, h, s)
}
