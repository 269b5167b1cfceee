package memory_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core/driver"
)

// These tests drive a Subscription as a Consumer does, through
// brokertest's Receiver (the Consumer's own window, settle-once and
// staleness): what a consumer of the memory broker meets.

// rrecv receives one message through r or fails the test after a
// generous timeout.
func rrecv(t testing.TB, r *brokertest.Receiver) *brokertest.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := r.Receive(ctx)
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return d
}

// rnoRecv asserts that r receives nothing within wait.
func rnoRecv(t testing.TB, r *brokertest.Receiver, wait time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	d, err := r.Receive(ctx)
	if err == nil {
		t.Fatalf("Receive: got %q attempt %d, want nothing", d.Message().ID, d.Message().Attempt)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive: %v, want context.DeadlineExceeded", err)
	}
}

func TestSettleTwice(t *testing.T) {
	b := newBroker(t)
	r := brokertest.StartReceiver(t, subscribe(t, b, "q"), 0)
	publish(t, b, "q", "a")
	d := rrecv(t, r)
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, err := range map[string]error{
		"Ack": d.Ack(ctx), "Retry": d.Retry(ctx, 0), "DeadLetter": d.DeadLetter(ctx, errors.New("x")),
		"AckBatch": r.AckBatch(ctx, []*brokertest.Delivery{d}),
	} {
		if !errors.Is(err, driver.ErrAlreadySettled) {
			t.Errorf("second %s = %v, want ErrAlreadySettled", name, err)
		}
	}
	if st := b.Stats("q"); st.Acked != 1 || st.Retried != 0 || st.DeadLettered != 0 || st.StaleSettlements != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

// TestLeaseIsNotExtended: a delivery is leased for the visibility timeout
// and never extended (the Subscription is no driver.Extender), so a
// consumer that holds it longer finds it redelivered to another and its
// own settlement stale, sent to nobody; settling it again is refused as a
// second settlement.
func TestLeaseIsNotExtended(t *testing.T) {
	const vt = 60 * time.Millisecond
	b := newBroker(t, memory.WithVisibilityTimeout(vt))
	s1 := subscribe(t, b, "q")
	if _, ok := driver.Source(s1).(driver.Extender); ok {
		t.Fatal("the Subscription is a driver.Extender")
	}
	r := brokertest.StartReceiver(t, s1, 0)
	if tr := r.Traits(); tr.Lease != vt || tr.MaxExtension != 0 || !tr.DelaysRetry {
		t.Fatalf("Traits = %+v, want the visibility timeout as Lease and DelaysRetry", tr)
	}
	s2 := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	d1 := rrecv(t, r)
	d2 := recv(t, s2) // the lease of d1 expired: concurrent duplicate
	if d2.ID != "a" || d2.Attempt != 2 {
		t.Fatalf("redelivery = %+v", d2)
	}
	if err := d1.Ack(context.Background()); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Fatalf("Ack held past the lease = %v, want a stale delivery", err)
	}
	ctx := context.Background()
	for _, err := range []error{d1.Retry(ctx, 0), d1.DeadLetter(ctx, errors.New("x"))} {
		if !errors.Is(err, driver.ErrAlreadySettled) {
			t.Fatalf("settling a stale delivery again = %v, want ErrAlreadySettled", err)
		}
	}
	// Nothing reached the broker: the newer copy is untouched.
	if st := b.Stats("q"); st.InFlight != 1 || st.Acked != 0 || st.Expired != 1 || st.StaleSettlements != 0 {
		t.Fatalf("stats after stale settlements = %+v", st)
	}
	if err := ack(s2, d2); err != nil {
		t.Fatalf("Ack of the current lease: %v", err)
	}
	if b.Len("q") != 0 {
		t.Fatalf("Len = %d", b.Len("q"))
	}
}

func TestLoseAckRedeliversAfterVisibilityTimeout(t *testing.T) {
	const vt = 50 * time.Millisecond
	b := newBroker(t, memory.WithVisibilityTimeout(vt), memory.WithFaults(memory.Faults{LoseAck: 1}))
	r := brokertest.StartReceiver(t, subscribe(t, b, "q"), 0)
	publish(t, b, "q", "a")
	d := rrecv(t, r)
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
	d2 := rrecv(t, r)
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

// TestWindowBlocksReceive: the Consumer's window bounds what it holds
// from the broker: a full window receives nothing more until a settlement
// frees room. A window below 1 is refused, naming it.
func TestWindowBlocksReceive(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	for _, n := range []int{0, -1} {
		if r, err := brokertest.NewReceiver(context.Background(), s, n, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil || !strings.Contains(err.Error(), "Window") {
			if r != nil {
				r.Close()
			}
			t.Fatalf("a window of %d = %v, want an error naming Window", n, err)
		}
	}
	r := brokertest.StartReceiver(t, s, 2)
	publish(t, b, "q", ids(5)...)
	d1, _ := rrecv(t, r), rrecv(t, r)
	rnoRecv(t, r, 30*time.Millisecond)
	if st := b.Stats("q"); st.InFlight != 2 || st.Ready != 3 {
		t.Fatalf("a full window took more from the broker: %+v", st)
	}
	got := make(chan *brokertest.Delivery, 1)
	go func() {
		d, err := r.Receive(context.Background())
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
		t.Fatal("Receive not woken by the settlement freeing room")
	}
}

// TestExpiredLeaseKeepsWindowSlotUntilSettled: a delivery whose lease
// expired keeps its room in the window until the consumer settles it (and
// that settlement is stale), so the consumer never holds more than its
// window.
func TestExpiredLeaseKeepsWindowSlotUntilSettled(t *testing.T) {
	b := newBroker(t, memory.WithVisibilityTimeout(20*time.Millisecond))
	r := brokertest.StartReceiver(t, subscribe(t, b, "q"), 1)
	publish(t, b, "q", "a")
	d := rrecv(t, r)
	eventually(t, "the lease to expire", func() bool { return b.Stats("q").Expired == 1 })
	rnoRecv(t, r, 30*time.Millisecond) // ready again, but the consumer still holds d
	if err := d.Ack(context.Background()); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Fatalf("Ack = %v, want a stale delivery", err)
	}
	if m := rrecv(t, r).Message(); m.Attempt != 2 {
		t.Fatalf("attempt %d", m.Attempt)
	}
}

// TestCloseReleasesWhatTheConsumerHolds: when the Consumer stops, what it
// holds undecided goes back to the front of the queue at once, through
// Release, ahead of what was ready.
func TestCloseReleasesWhatTheConsumerHolds(t *testing.T) {
	b := newBroker(t)
	r := brokertest.StartReceiver(t, subscribe(t, b, "q"), 0)
	publish(t, b, "q", "a", "b", "c")
	da, _ := rrecv(t, r), rrecv(t, r)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := da.Ack(context.Background()); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Fatalf("Ack after Close = %v, want a stale delivery", err)
	}
	s2 := subscribe(t, b, "q")
	for _, want := range []struct {
		id      string
		attempt int
	}{{"a", 2}, {"b", 2}, {"c", 1}} {
		if m := recv(t, s2); m.ID != want.id || m.Attempt != want.attempt {
			t.Fatalf("got %s attempt %d, want %s attempt %d", m.ID, m.Attempt, want.id, want.attempt)
		}
	}
	if st := b.Stats("q"); st.Requeued != 2 || st.Acked != 0 {
		t.Fatalf("stats = %+v", st)
	}
}
