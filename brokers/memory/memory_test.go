package memory_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
)

func newBroker(t testing.TB, opts ...memory.Option) *memory.Broker {
	t.Helper()
	b, err := memory.NewBroker(opts...)
	if err != nil {
		t.Fatalf("NewBroker: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func subscribe(t testing.TB, b *memory.Broker, queue string, opts ...memory.SubscribeOption) *memory.Subscription {
	t.Helper()
	s, err := b.Subscribe(queue, opts...)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func publish(t testing.TB, b *memory.Broker, queue string, ids ...string) {
	t.Helper()
	msgs := make([]*driver.Message, len(ids))
	for i, id := range ids {
		msgs[i] = &driver.Message{ID: id, Body: []byte("body-" + id), Headers: map[string]string{"h": id}, Key: "k-" + id}
	}
	if err := b.Publish(context.Background(), queue, msgs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("m%05d", i)
	}
	return out
}

// recv receives one delivery or fails the test after a generous timeout.
func recv(t testing.TB, s *memory.Subscription) driver.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := s.Receive(ctx)
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return d
}

// noRecv asserts that nothing is received within wait.
func noRecv(t testing.TB, s *memory.Subscription, wait time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	d, err := s.Receive(ctx)
	if err == nil {
		t.Fatalf("Receive: got %q attempt %d, want nothing", d.Message().ID, d.Message().Attempt)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive: %v, want context.DeadlineExceeded", err)
	}
}

// eventually waits until cond holds, failing the test after a generous
// timeout; timing assertions wait for what they need instead of sleeping a
// fixed time, so a loaded machine makes them slower, not flaky.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAckRemovesMessage(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a", "b")
	for _, want := range []string{"a", "b"} {
		d := recv(t, s)
		m := d.Message()
		if m.ID != want || string(m.Body) != "body-"+want || m.Headers["h"] != want || m.Key != "k-"+want {
			t.Fatalf("got %+v, want message %q", m, want)
		}
		if m.Source != "q" || m.System != "memory" || m.Attempt != 1 || m.ReceivedAt.IsZero() {
			t.Fatalf("delivery fields: %+v", m)
		}
		if driver.MetadataOf(m.Metadata)[memory.MetaDeliverySeq] == "" || driver.MetadataOf(m.Metadata)[memory.MetaPublishSeq] == "" {
			t.Fatalf("metadata missing: %v", m.Metadata)
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	}
	if n := b.Len("q"); n != 0 {
		t.Fatalf("Len = %d, want 0", n)
	}
	st := b.Stats("q")
	if st.Published != 2 || st.Delivered != 2 || st.Acked != 2 || st.InFlight != 0 || st.Ready != 0 || st.Redelivered != 0 {
		t.Fatalf("stats = %+v", st)
	}
	noRecv(t, s, 30*time.Millisecond)
}

func TestPublishCopiesMessage(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	m := &driver.Message{ID: "a", Body: []byte("xyz"), Headers: map[string]string{"h": "1"}}
	if err := b.Publish(context.Background(), "q", m); err != nil {
		t.Fatal(err)
	}
	m.Body[0] = 'X'
	m.Headers["h"] = "2"
	d := recv(t, s)
	if string(d.Message().Body) != "xyz" || d.Message().Headers["h"] != "1" {
		t.Fatalf("broker kept the producer's buffers: %+v", d.Message())
	}
	// A consumer changing its copy does not change the redelivery.
	d.Message().ID = "changed"
	d.Message().Body[0] = 'Q'
	if err := d.Retry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	d2 := recv(t, s)
	if d2.Message().ID != "a" || string(d2.Message().Body) != "xyz" {
		t.Fatalf("redelivery changed by the consumer: %+v", d2.Message())
	}
}

func TestEmptyIDIsDelivered(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "")
	d := recv(t, s)
	if d.Message().ID != "" {
		t.Fatalf("ID = %q", d.Message().ID)
	}
	if err := d.DeadLetter(context.Background(), core.ErrMissingID); err != nil {
		t.Fatal(err)
	}
	if dl := b.DeadLetters("q"); len(dl) != 1 || !errors.Is(dl[0].Cause, core.ErrMissingID) {
		t.Fatalf("dead letters = %+v", dl)
	}
}

func TestRetryRedeliversAfterDelay(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	d := recv(t, s)
	const delay = 80 * time.Millisecond
	start := time.Now()
	if err := d.Retry(context.Background(), delay); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	if st := b.Stats("q"); st.Delayed != 1 || st.InFlight != 0 || st.Retried != 1 {
		t.Fatalf("stats after retry = %+v", st)
	}
	if b.Len("q") != 1 {
		t.Fatalf("Len = %d, want 1 (delayed counts)", b.Len("q"))
	}
	noRecv(t, s, delay/2)
	d2 := recv(t, s)
	if el := time.Since(start); el < delay {
		t.Fatalf("redelivered after %v, want >= %v", el, delay)
	}
	if d2.Message().ID != "a" || d2.Message().Attempt != 2 {
		t.Fatalf("redelivery = %+v, want a at attempt 2", d2.Message())
	}
	if err := d2.Retry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if d3 := recv(t, s); d3.Message().Attempt != 3 {
		t.Fatalf("attempt = %d, want 3", d3.Message().Attempt)
	}
}

func TestRetryGoesBehindReadyMessages(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a", "b")
	d := recv(t, s)
	if err := d.Retry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, s).Message().ID; got != "b" {
		t.Fatalf("got %q, want b before the retried a", got)
	}
	if got := recv(t, s).Message(); got.ID != "a" || got.Attempt != 2 {
		t.Fatalf("got %+v, want a at attempt 2", got)
	}
}

func TestDeadLetterParksWithCauseAndRedrive(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a", "b")
	cause := core.Permanent(errors.New("bad payload"))
	d := recv(t, s)
	if err := d.Retry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, s).Ack(context.Background()); err != nil { // b
		t.Fatal(err)
	}
	d = recv(t, s) // a, attempt 2
	if err := d.DeadLetter(context.Background(), cause); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	dls := b.DeadLetters("q")
	if len(dls) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dls))
	}
	dl := dls[0]
	if dl.Message.ID != "a" || dl.Message.Attempt != 2 || !core.IsPermanent(dl.Cause) || dl.At.IsZero() {
		t.Fatalf("dead letter = %+v", dl)
	}
	if st := b.Stats("q"); st.DeadLettered != 1 || st.DeadLetters != 1 || b.Len("q") != 0 {
		t.Fatalf("stats = %+v len %d", st, b.Len("q"))
	}
	noRecv(t, s, 20*time.Millisecond)

	if n := b.Redrive("q"); n != 1 {
		t.Fatalf("Redrive = %d, want 1", n)
	}
	if len(b.DeadLetters("q")) != 0 {
		t.Fatal("dead letters left after redrive")
	}
	d = recv(t, s)
	if d.Message().ID != "a" || d.Message().Attempt != 1 {
		t.Fatalf("redriven = %+v, want a at attempt 1", d.Message())
	}
	if err := d.DeadLetter(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if dls := b.DeadLetters("q"); len(dls) != 1 || dls[0].Cause == nil {
		t.Fatalf("nil cause not recorded: %+v", dls)
	}
	if st := b.Stats("q"); st.Redriven != 1 || st.DeadLettered != 2 {
		t.Fatalf("stats = %+v", st)
	}
	if n := b.Redrive("nope"); n != 0 {
		t.Fatalf("Redrive of unknown queue = %d", n)
	}
}

func TestVisibilityExpiryRedeliversAndStaleSettlementIsRefused(t *testing.T) {
	const vt = 60 * time.Millisecond
	b := newBroker(t, memory.WithVisibilityTimeout(vt))
	s1 := subscribe(t, b, "q")
	s2 := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	start := time.Now()
	d1 := recv(t, s1)
	noRecv(t, s2, vt/3)
	d2 := recv(t, s2) // the lease of d1 expired: concurrent duplicate
	if el := time.Since(start); el < vt {
		t.Fatalf("redelivered after %v, want >= %v", el, vt)
	}
	if d2.Message().ID != "a" || d2.Message().Attempt != 2 {
		t.Fatalf("redelivery = %+v", d2.Message())
	}
	// The stale lease's ack must not ack the newer copy still in flight.
	if err := d1.Ack(context.Background()); !errors.Is(err, memory.ErrLeaseExpired) {
		t.Fatalf("stale Ack = %v, want ErrLeaseExpired", err)
	}
	if st := b.Stats("q"); st.InFlight != 1 || st.Acked != 0 || st.Expired != 1 || st.StaleSettlements != 1 {
		t.Fatalf("stats after stale ack = %+v", st)
	}
	for _, err := range []error{d1.Retry(context.Background(), 0), d1.DeadLetter(context.Background(), errors.New("x"))} {
		if !errors.Is(err, driver.ErrAlreadySettled) {
			t.Fatalf("settling a stale delivery again = %v, want ErrAlreadySettled", err)
		}
	}
	if err := d2.Ack(context.Background()); err != nil {
		t.Fatalf("Ack of the current lease: %v", err)
	}
	if b.Len("q") != 0 {
		t.Fatalf("Len = %d", b.Len("q"))
	}
}

func TestStaleRetryAndDeadLetterChangeNothing(t *testing.T) {
	b := newBroker(t, memory.WithVisibilityTimeout(30*time.Millisecond))
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a", "b")
	da, db := recv(t, s), recv(t, s)
	eventually(t, "both leases to expire", func() bool { return b.Stats("q").Expired == 2 })
	if err := da.Retry(context.Background(), time.Hour); !errors.Is(err, memory.ErrLeaseExpired) {
		t.Fatalf("stale Retry = %v", err)
	}
	if err := db.DeadLetter(context.Background(), errors.New("x")); !errors.Is(err, memory.ErrLeaseExpired) {
		t.Fatalf("stale DeadLetter = %v", err)
	}
	if st := b.Stats("q"); st.Ready != 2 || st.Delayed != 0 || st.DeadLetters != 0 {
		t.Fatalf("stale settlements changed the queue: %+v", st)
	}
}

func TestExtendVisibility(t *testing.T) {
	const vt = 200 * time.Millisecond
	b := newBroker(t, memory.WithVisibilityTimeout(vt))
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	d := recv(t, s).(*memory.Delivery)
	for range 3 {
		time.Sleep(vt / 4)
		if err := d.ExtendVisibility(context.Background(), vt); err != nil {
			t.Fatalf("ExtendVisibility: %v", err)
		}
	}
	if st := b.Stats("q"); st.Expired != 0 || st.InFlight != 1 {
		t.Fatalf("lease expired despite heartbeats: %+v", st)
	}
	if err := d.ExtendVisibility(context.Background(), 0); err == nil {
		t.Fatal("ExtendVisibility(0) succeeded")
	}
	if err := d.ExtendVisibility(context.Background(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	d2 := recv(t, s)
	if d2.Message().Attempt != 2 {
		t.Fatalf("attempt %d after a shortened lease", d2.Message().Attempt)
	}
	if err := d.ExtendVisibility(context.Background(), vt); !errors.Is(err, memory.ErrLeaseExpired) {
		t.Fatalf("extend stale = %v", err)
	}
}

func TestSettleTwice(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	d := recv(t, s)
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, err := range map[string]error{
		"Ack": d.Ack(ctx), "Retry": d.Retry(ctx, 0), "DeadLetter": d.DeadLetter(ctx, errors.New("x")),
		"AckBatch": s.AckBatch(ctx, []driver.Delivery{d}),
	} {
		if !errors.Is(err, driver.ErrAlreadySettled) {
			t.Errorf("second %s = %v, want ErrAlreadySettled", name, err)
		}
	}
	if st := b.Stats("q"); st.Acked != 1 || st.Retried != 0 || st.DeadLettered != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestSettleWithDoneContextSettlesNothing(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	d := recv(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Ack(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Ack = %v", err)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatalf("Ack after a cancelled attempt: %v", err)
	}
}

func TestCrashRedeliversEverythingInFlight(t *testing.T) {
	b := newBroker(t) // 30s visibility: only the crash can bring them back
	s1 := subscribe(t, b, "q")
	s2 := subscribe(t, b, "q")
	publish(t, b, "q", "a", "b", "c", "d")
	da, db, dc := recv(t, s1), recv(t, s1), recv(t, s1)
	if err := da.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	s1.Crash()
	if _, err := s1.Receive(context.Background()); !errors.Is(err, memory.ErrCrashed) || !errors.Is(err, core.ErrSourceClosed) {
		t.Fatalf("Receive after crash = %v, want ErrCrashed wrapping core.ErrSourceClosed", err)
	}
	for _, d := range []driver.Delivery{db, dc} {
		if err := d.Ack(context.Background()); !errors.Is(err, memory.ErrCrashed) {
			t.Fatalf("Ack after crash = %v, want ErrCrashed", err)
		}
	}
	// Requeued at the front, in delivery order, with the next attempt.
	for _, want := range []string{"b", "c"} {
		m := recv(t, s2).Message()
		if m.ID != want || m.Attempt != 2 {
			t.Fatalf("got %s attempt %d, want %s attempt 2", m.ID, m.Attempt, want)
		}
	}
	if m := recv(t, s2).Message(); m.ID != "d" || m.Attempt != 1 {
		t.Fatalf("got %+v, want d attempt 1", m)
	}
	st := b.Stats("q")
	if st.Crashes != 1 || st.Requeued != 2 || st.Redelivered != 2 || st.Acked != 1 {
		t.Fatalf("stats = %+v", st)
	}
	s1.Crash() // idempotent
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	if b.Stats("q").Crashes != 1 {
		t.Fatal("second Crash counted")
	}
}

func TestCrashWakesBlockedReceive(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	errc := make(chan error, 1)
	go func() {
		_, err := s.Receive(context.Background())
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	s.Crash()
	select {
	case err := <-errc:
		if !errors.Is(err, memory.ErrCrashed) {
			t.Fatalf("Receive = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Receive not woken by Crash")
	}
}

func TestLoseAckRedeliversAfterVisibilityTimeout(t *testing.T) {
	const vt = 50 * time.Millisecond
	b := newBroker(t, memory.WithVisibilityTimeout(vt), memory.WithFaults(memory.Faults{LoseAck: 1}))
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	d := recv(t, s)
	if err := d.Ack(context.Background()); err != nil {
		t.Fatalf("lost Ack returned %v, want nil", err)
	}
	if st := b.Stats("q"); st.AcksLost != 1 || st.Acked != 0 || st.InFlight != 1 {
		t.Fatalf("stats = %+v", st)
	}
	if err := d.Ack(context.Background()); !errors.Is(err, driver.ErrAlreadySettled) {
		t.Fatalf("second Ack = %v", err)
	}
	if err := b.SetFaults(memory.Faults{}); err != nil {
		t.Fatal(err)
	}
	d2 := recv(t, s)
	if d2.Message().ID != "a" || d2.Message().Attempt != 2 {
		t.Fatalf("redelivery = %+v", d2.Message())
	}
	if err := d2.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats("q"); st.Acked != 1 || st.Expired != 1 || b.Len("q") != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestLostAckIsRequeuedByCrash(t *testing.T) {
	b := newBroker(t, memory.WithFaults(memory.Faults{LoseAck: 1}))
	s1 := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	if err := recv(t, s1).Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	s1.Crash() // the broker still held the lease: the connection drop returns it
	s2 := subscribe(t, b, "q")
	if m := recv(t, s2).Message(); m.ID != "a" || m.Attempt != 2 {
		t.Fatalf("got %+v", m)
	}
}

func TestCrashOnAck(t *testing.T) {
	b := newBroker(t, memory.WithFaults(memory.Faults{CrashOnAck: 1}))
	s1 := subscribe(t, b, "q")
	publish(t, b, "q", "a", "b")
	da, db := recv(t, s1), recv(t, s1)
	if err := da.Ack(context.Background()); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Ack = %v, want ErrCrashed", err)
	}
	if err := db.Ack(context.Background()); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Ack after crash = %v, want ErrCrashed", err)
	}
	if _, err := s1.Receive(context.Background()); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Receive = %v", err)
	}
	b.SetFaults(memory.Faults{})
	s2 := subscribe(t, b, "q")
	for _, want := range []string{"a", "b"} {
		d := recv(t, s2)
		if m := d.Message(); m.ID != want || m.Attempt != 2 {
			t.Fatalf("got %s attempt %d, want %s attempt 2", m.ID, m.Attempt, want)
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if st := b.Stats("q"); st.Crashes != 1 || st.Acked != 2 {
		t.Fatalf("stats = %+v", st)
	}
}

// duplicated publishes n messages and returns which ids were enqueued
// twice.
func duplicated(t *testing.T, seed uint64, n int) map[string]bool {
	b := newBroker(t, memory.WithSeed(seed), memory.WithFaults(memory.Faults{DuplicatePublish: 0.2}))
	publish(t, b, "payments", ids(n)...)
	s := subscribe(t, b, "payments")
	seen := map[string]int{}
	for range b.Len("payments") {
		d := recv(t, s)
		seen[d.Message().ID]++
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	dups := map[string]bool{}
	for id, c := range seen {
		if c > 2 {
			t.Fatalf("%s enqueued %d times", id, c)
		}
		if c == 2 {
			dups[id] = true
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct ids delivered, want %d", len(seen), n)
	}
	st := b.Stats("payments")
	if st.DuplicatesPublished != int64(len(dups)) || st.Published != int64(n+len(dups)) {
		t.Fatalf("stats %+v, counted %d duplicates", st, len(dups))
	}
	return dups
}

func TestDuplicatePublishRateIsSeededAndReproducible(t *testing.T) {
	const n = 10000
	a := duplicated(t, 42, n)
	if got := float64(len(a)) / n; got < 0.18 || got > 0.22 {
		t.Fatalf("duplicate rate %.3f, want about 0.2", got)
	}
	b := duplicated(t, 42, n)
	if len(a) != len(b) {
		t.Fatalf("same seed: %d vs %d duplicates", len(a), len(b))
	}
	for id := range a {
		if !b[id] {
			t.Fatalf("same seed, %s duplicated only once", id)
		}
	}
	c := duplicated(t, 43, n)
	same := 0
	for id := range c {
		if a[id] {
			same++
		}
	}
	if same == len(a) && len(a) == len(c) {
		t.Fatal("different seeds gave the same duplicates")
	}
}

func TestWindowBlocksReceive(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q", memory.WithWindow(2))
	publish(t, b, "q", ids(5)...)
	d1, _ := recv(t, s), recv(t, s)
	noRecv(t, s, 30*time.Millisecond)
	got := make(chan driver.Delivery, 1)
	go func() {
		d, err := s.Receive(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- d
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("Receive returned with a full window")
	default:
	}
	if err := d1.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-got:
		if d.Message().ID != "m00002" {
			t.Fatalf("got %s", d.Message().ID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Receive not woken by the settlement freeing a slot")
	}
	// Raising the window wakes a blocked receiver.
	go func() {
		d, err := s.Receive(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- d
	}()
	time.Sleep(20 * time.Millisecond)
	if err := s.SetWindow(5); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("Receive not woken by SetWindow")
	}
	recv(t, s)
	for _, n := range []int{0, -1} {
		if err := s.SetWindow(n); err == nil || !strings.Contains(err.Error(), "Window") {
			t.Fatalf("SetWindow(%d) = %v, want an error naming Window", n, err)
		}
	}
}

func TestExpiredLeaseKeepsWindowSlotUntilSettled(t *testing.T) {
	b := newBroker(t, memory.WithVisibilityTimeout(20*time.Millisecond))
	s := subscribe(t, b, "q", memory.WithWindow(1))
	publish(t, b, "q", "a")
	d := recv(t, s)
	eventually(t, "the lease to expire", func() bool { return b.Stats("q").Expired == 1 })
	noRecv(t, s, 30*time.Millisecond) // ready again, but the consumer still holds d
	if err := d.Ack(context.Background()); !errors.Is(err, memory.ErrLeaseExpired) {
		t.Fatalf("Ack = %v", err)
	}
	if m := recv(t, s).Message(); m.Attempt != 2 {
		t.Fatalf("attempt %d", m.Attempt)
	}
}

func TestReceiveRespectsContextAndPassesWakeups(t *testing.T) {
	b := newBroker(t)
	s1 := subscribe(t, b, "q")
	s2 := subscribe(t, b, "q")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := s1.Receive(ctx)
		errc <- err
	}()
	got := make(chan string, 1)
	go func() {
		d, err := s2.Receive(context.Background())
		if err != nil {
			t.Error(err)
			got <- ""
			return
		}
		got <- d.Message().ID
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Receive = %v, want context.Canceled", err)
	}
	publish(t, b, "q", "a")
	select {
	case id := <-got:
		if id != "a" {
			t.Fatalf("got %q", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("remaining receiver never woken")
	}
}

func TestSubscriptionCloseRequeues(t *testing.T) {
	b := newBroker(t)
	s1 := subscribe(t, b, "q")
	publish(t, b, "q", "a", "b")
	da := recv(t, s1)
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := da.Ack(context.Background()); !errors.Is(err, memory.ErrSubscriptionClosed) {
		t.Fatalf("Ack after Close = %v", err)
	}
	if _, err := s1.Receive(context.Background()); !errors.Is(err, memory.ErrSubscriptionClosed) || !errors.Is(err, core.ErrSourceClosed) {
		t.Fatalf("Receive after Close = %v", err)
	}
	s2 := subscribe(t, b, "q")
	if m := recv(t, s2).Message(); m.ID != "a" || m.Attempt != 2 {
		t.Fatalf("got %+v", m)
	}
	if st := b.Stats("q"); st.Requeued != 1 || st.Crashes != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestAckBatch(t *testing.T) {
	b := newBroker(t, memory.WithVisibilityTimeout(40*time.Millisecond))
	s := subscribe(t, b, "q", memory.WithWindow(3))
	other := subscribe(t, b, "q")
	publish(t, b, "q", ids(5)...)
	ds := []driver.Delivery{recv(t, s), recv(t, s), recv(t, s)}
	foreign := recv(t, other)
	if err := s.AckBatch(context.Background(), append(ds[:2:2], foreign)); !errors.Is(err, memory.ErrForeignDelivery) {
		t.Fatalf("AckBatch with a foreign delivery = %v", err)
	}
	if b.Stats("q").Acked != 0 {
		t.Fatal("a failed AckBatch acked something")
	}
	if err := s.AckBatch(context.Background(), ds); err != nil {
		t.Fatalf("AckBatch: %v", err)
	}
	if st := b.Stats("q"); st.Acked != 3 || st.InFlight != 1 {
		t.Fatalf("stats = %+v", st)
	}
	// Partial: one stale, one fresh.
	stale := recv(t, s)
	eventually(t, "the leases to expire", func() bool { return b.Stats("q").Expired == 2 })
	fresh := recv(t, s)
	err := s.AckBatch(context.Background(), []driver.Delivery{stale, fresh})
	if !errors.Is(err, memory.ErrLeaseExpired) || !strings.Contains(err.Error(), "ds[0]") {
		t.Fatalf("AckBatch = %v, want ErrLeaseExpired for ds[0]", err)
	}
	if st := b.Stats("q"); st.Acked != 4 {
		t.Fatalf("fresh delivery in a partial batch not acked: %+v", st)
	}
}

func TestAckBatchFaults(t *testing.T) {
	b := newBroker(t, memory.WithFaults(memory.Faults{LoseAck: 1}))
	s := subscribe(t, b, "q")
	publish(t, b, "q", ids(3)...)
	ds := []driver.Delivery{recv(t, s), recv(t, s), recv(t, s)}
	if err := s.AckBatch(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats("q"); st.AcksLost != 3 || st.InFlight != 3 || st.Acked != 0 {
		t.Fatalf("lost batch: %+v", st)
	}
	b.SetFaults(memory.Faults{CrashOnAck: 1})
	s2 := subscribe(t, b, "q")
	publish(t, b, "q", "x")
	d := recv(t, s2)
	if err := s2.AckBatch(context.Background(), []driver.Delivery{d}); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("AckBatch = %v, want ErrCrashed", err)
	}
	if st := b.Stats("q"); st.Ready != 1 || st.Crashes != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestWaitIdle(t *testing.T) {
	b := newBroker(t)
	if err := b.WaitIdle(context.Background(), "q"); err != nil {
		t.Fatalf("WaitIdle on an empty queue: %v", err)
	}
	publish(t, b, "q", ids(20)...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := b.WaitIdle(ctx, "q"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitIdle with work left = %v", err)
	}
	s := subscribe(t, b, "q")
	var acked atomic.Int64
	go func() {
		for i := range 20 {
			d, err := s.Receive(context.Background())
			if err != nil {
				return
			}
			if i%5 == 0 && d.Message().Attempt == 1 {
				d.Retry(context.Background(), 5*time.Millisecond)
				continue
			}
			time.Sleep(time.Millisecond)
			// Counted before the ack: WaitIdle may return as soon as the
			// last ack lands, before Ack returns here.
			acked.Add(1)
			d.Ack(context.Background())
		}
		for {
			d, err := s.Receive(context.Background())
			if err != nil {
				return
			}
			acked.Add(1)
			d.Ack(context.Background())
		}
	}()
	if err := b.WaitIdle(context.Background(), "q"); err != nil {
		t.Fatal(err)
	}
	if n := acked.Load(); n != 20 {
		t.Fatalf("WaitIdle returned with %d of 20 acked", n)
	}
}

func TestConcurrentSubscribersShareQueue(t *testing.T) {
	b := newBroker(t) // visibility 30s: no lease expires
	const n, subs = 3000, 4
	var (
		mu      sync.Mutex
		holding = map[string]int{} // publish seq → holder
		counts  = map[string]int{}
		perSub  [subs]int
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := range subs {
		s := subscribe(t, b, "q", memory.WithWindow(8))
		wg.Go(func() {
			for {
				d, err := s.Receive(ctx)
				if err != nil {
					return
				}
				key := driver.MetadataOf(d.Message().Metadata)[memory.MetaPublishSeq]
				mu.Lock()
				if h, ok := holding[key]; ok {
					t.Errorf("%s held by %d and %d at once", key, h, i)
				}
				holding[key] = i
				counts[d.Message().ID]++
				perSub[i]++
				mu.Unlock()
				time.Sleep(50 * time.Microsecond) // work, so that the others get a share
				mu.Lock()
				delete(holding, key)
				mu.Unlock()
				if err := d.Ack(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for i := 0; i < n; i += 100 {
		publish(t, b, "q", ids(n)[i:i+100]...)
	}
	if err := b.WaitIdle(context.Background(), "q"); err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	if len(counts) != n {
		t.Fatalf("%d distinct delivered, want %d", len(counts), n)
	}
	for id, c := range counts {
		if c != 1 {
			t.Fatalf("%s delivered %d times without faults", id, c)
		}
	}
	for i, c := range perSub {
		if c == 0 {
			t.Errorf("subscription %d got nothing: %v", i, perSub)
		}
	}
	if st := b.Stats("q"); st.Acked != n || st.Delivered != n {
		t.Fatalf("stats = %+v", st)
	}
}

// TestConcurrentDuplicatesOnlyAfterExpiry runs subscribers that sometimes
// outlive their lease: a message may then be held by two at once, but only
// if the earlier lease expired, and every message is still acked exactly
// once by a current lease.
func TestConcurrentDuplicatesOnlyAfterExpiry(t *testing.T) {
	const vt = 15 * time.Millisecond
	b := newBroker(t, memory.WithVisibilityTimeout(vt))
	const n, subs = 200, 4
	var (
		mu      sync.Mutex
		holding = map[string][]time.Time{}
		overlap int
		acked   = map[string]int{}
		// again is closed when the first lease-outliving holder's message
		// is handed out again: that holder keeps it until then (the copy
		// waits behind the queue), so one overlap is seen however slow
		// the machine is.
		again   = map[string]chan struct{}{}
		waiting bool
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := range subs {
		s := subscribe(t, b, "q")
		wg.Go(func() {
			for j := 0; ; j++ {
				d, err := s.Receive(ctx)
				if err != nil {
					return
				}
				id := d.Message().ID
				now := time.Now()
				mu.Lock()
				for _, since := range holding[id] {
					if now.Sub(since) < vt {
						t.Errorf("%s handed out again %v after the previous lease began (< %v)", id, now.Sub(since), vt)
					}
					overlap++
				}
				if c, ok := again[id]; ok && len(holding[id]) > 0 {
					close(c)
					delete(again, id)
				}
				holding[id] = append(holding[id], d.Message().ReceivedAt)
				outlive := (i+j)%7 == 0 && d.Message().Attempt == 1
				var seen chan struct{}
				if outlive && !waiting {
					waiting = true
					seen = make(chan struct{})
					again[id] = seen
				}
				mu.Unlock()
				if outlive {
					time.Sleep(2 * vt) // outlive the lease
				}
				if seen != nil {
					select {
					case <-seen:
					case <-time.After(30 * time.Second):
						t.Errorf("%s was not handed out again while its expired lease was held", id)
					}
				}
				err = d.Ack(context.Background()) // settle even after cancel
				mu.Lock()
				if k := slices.Index(holding[id], d.Message().ReceivedAt); k >= 0 {
					holding[id] = slices.Delete(holding[id], k, k+1)
				}
				if err == nil {
					acked[id]++
				} else if !errors.Is(err, memory.ErrLeaseExpired) {
					t.Errorf("Ack: %v", err)
				}
				mu.Unlock()
			}
		})
	}
	publish(t, b, "q", ids(n)...)
	if err := b.WaitIdle(context.Background(), "q"); err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	for _, id := range ids(n) {
		if acked[id] != 1 {
			t.Fatalf("%s acked %d times", id, acked[id])
		}
	}
	st := b.Stats("q")
	if st.Expired == 0 || overlap == 0 || st.StaleSettlements != st.Expired {
		t.Fatalf("expected expiries with concurrent holders: overlap %d, stats %+v", overlap, st)
	}
}

func TestBrokerCloseStopsEverything(t *testing.T) {
	b, err := memory.NewBroker(memory.WithVisibilityTimeout(20 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.Subscribe("q")
	if err != nil {
		t.Fatal(err)
	}
	publish(t, b, "q", "a", "b")
	d := recv(t, s)
	d2 := recv(t, s)
	if err := d2.Retry(context.Background(), 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 2)
	go func() { _, err := s.Receive(context.Background()); errc <- err }()
	go func() { errc <- b.WaitIdle(context.Background(), "q") }()
	time.Sleep(5 * time.Millisecond)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case err := <-errc:
			if !errors.Is(err, memory.ErrBrokerClosed) || !errors.Is(err, core.ErrSourceClosed) {
				t.Fatalf("blocked call returned %v, want ErrBrokerClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("blocked call not woken by Close")
		}
	}
	before := b.Stats("q")
	time.Sleep(60 * time.Millisecond) // past the lease and the retry delay
	if after := b.Stats("q"); after != before {
		t.Fatalf("timers ran after Close: %+v → %+v", before, after)
	}
	if err := d.Ack(context.Background()); !errors.Is(err, memory.ErrBrokerClosed) {
		t.Fatalf("Ack after Close = %v", err)
	}
	if err := b.Publish(context.Background(), "q", &driver.Message{ID: "x"}); !errors.Is(err, memory.ErrBrokerClosed) {
		t.Fatalf("Publish after Close = %v", err)
	}
	if _, err := b.Subscribe("q"); !errors.Is(err, memory.ErrBrokerClosed) {
		t.Fatalf("Subscribe after Close = %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestInvalidOptions(t *testing.T) {
	for _, tc := range []struct {
		opt   memory.Option
		field string
	}{
		{memory.WithVisibilityTimeout(0), "VisibilityTimeout"},
		{memory.WithFaults(memory.Faults{LoseAck: -0.1}), "LoseAck"},
		{memory.WithFaults(memory.Faults{CrashOnAck: 1.5}), "CrashOnAck"},
		{memory.WithFaults(memory.Faults{DuplicatePublish: 2}), "DuplicatePublish"},
	} {
		if _, err := memory.NewBroker(tc.opt); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("NewBroker = %v, want an error naming %s", err, tc.field)
		}
	}
	b := newBroker(t)
	if _, err := b.Subscribe("q", memory.WithWindow(0)); err == nil || !strings.Contains(err.Error(), "Window") {
		t.Errorf("Subscribe = %v, want an error naming Window", err)
	}
	if _, err := b.Subscribe(""); err == nil {
		t.Error("Subscribe to an empty queue name succeeded")
	}
	if err := b.SetFaults(memory.Faults{LoseAck: 1.1}); err == nil || !strings.Contains(err.Error(), "LoseAck") {
		t.Errorf("SetFaults = %v", err)
	}
	if err := b.Publish(context.Background(), "q", nil); err == nil || !strings.Contains(err.Error(), "msgs[0]") {
		t.Errorf("Publish(nil) = %v", err)
	}
}

func TestMetadataSequences(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	d := recv(t, s)
	d.Retry(context.Background(), 0)
	d2 := recv(t, s)
	m1, m2 := driver.MetadataOf(d.Message().Metadata), driver.MetadataOf(d2.Message().Metadata)
	if m1[memory.MetaPublishSeq] != m2[memory.MetaPublishSeq] {
		t.Fatalf("publish seq changed across redelivery: %v %v", m1, m2)
	}
	s1, _ := strconv.Atoi(m1[memory.MetaDeliverySeq])
	s2, _ := strconv.Atoi(m2[memory.MetaDeliverySeq])
	if s2 <= s1 {
		t.Fatalf("delivery seq not increasing: %v %v", m1, m2)
	}
}

// lostAcks acks n messages in batches with the LoseAck fault and returns
// which ids lost their ack.
func lostAcks(t *testing.T, seed uint64, n, batch int) map[string]bool {
	b := newBroker(t, memory.WithSeed(seed), memory.WithFaults(memory.Faults{LoseAck: 0.1}))
	publish(t, b, "q", ids(n)...)
	s := subscribe(t, b, "q")
	var ds []driver.Delivery
	for range n {
		ds = append(ds, recv(t, s))
		if len(ds) == batch {
			if err := s.AckBatch(context.Background(), ds); err != nil {
				t.Fatal(err)
			}
			ds = ds[:0]
		}
	}
	st := b.Stats("q")
	if st.AcksLost+st.Acked != int64(n) || st.InFlight != int(st.AcksLost) {
		t.Fatalf("stats = %+v", st)
	}
	s.Crash() // requeue the lost ones to see which they were
	s2 := subscribe(t, b, "q")
	lost := map[string]bool{}
	for range st.AcksLost {
		lost[recv(t, s2).Message().ID] = true
	}
	return lost
}

func TestAckBatchFaultRatesArePerDeliveryAndSeeded(t *testing.T) {
	const n = 2000
	a := lostAcks(t, 7, n, 100)
	if got := float64(len(a)) / n; got < 0.07 || got > 0.13 {
		t.Fatalf("lost-ack rate %.3f in batches of 100, want about 0.1", got)
	}
	b := lostAcks(t, 7, n, 100)
	if len(a) != len(b) {
		t.Fatalf("same seed: %d vs %d lost", len(a), len(b))
	}
	for id := range a {
		if !b[id] {
			t.Fatalf("same seed: %s lost only once", id)
		}
	}
}

func TestNoGoroutineLeftAfterClose(t *testing.T) {
	base := runtime.NumGoroutine()
	b, err := memory.NewBroker(memory.WithVisibilityTimeout(30 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for q := range 3 {
		queue := fmt.Sprint("q", q)
		publish(t, b, queue, ids(50)...)
		for range 2 {
			s, err := b.Subscribe(queue, memory.WithWindow(5))
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				for i := 0; ; i++ {
					d, err := s.Receive(context.Background())
					if err != nil {
						return // the broker closed
					}
					switch i % 3 {
					case 0:
						d.Retry(context.Background(), time.Hour) // a timer far away
					case 1:
						d.Ack(context.Background())
					} // case 2: left to expire
				}
			})
		}
		go b.WaitIdle(context.Background(), queue) // returns on Close
	}
	time.Sleep(50 * time.Millisecond)
	b.Close()
	wg.Wait()
	eventually(t, "goroutines to return to the baseline", func() bool { return runtime.NumGoroutine() <= base })
}
