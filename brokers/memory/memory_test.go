package memory_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

func subscribe(t testing.TB, b *memory.Broker, queue string) *memory.Subscription {
	t.Helper()
	s, err := b.Subscribe(queue)
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

// recvN receives up to max messages from s in one Receive call, failing
// the test after a generous timeout.
func recvN(t testing.TB, s *memory.Subscription, max int) []*driver.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ms, err := s.Receive(ctx, max)
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	if len(ms) == 0 || len(ms) > max {
		t.Fatalf("Receive(%d) returned %d messages", max, len(ms))
	}
	return ms
}

// recv receives one message from s.
func recv(t testing.TB, s *memory.Subscription) *driver.Message {
	t.Helper()
	return recvN(t, s, 1)[0]
}

// noRecv asserts that nothing is received within wait.
func noRecv(t testing.TB, s *memory.Subscription, wait time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ms, err := s.Receive(ctx, 1)
	if err == nil {
		t.Fatalf("Receive: got %q attempt %d, want nothing", ms[0].ID, ms[0].Attempt)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive: %v, want context.DeadlineExceeded", err)
	}
}

// ack, retry, deadLetter and release settle ms through s's driver
// methods, as the Consumer does.
func ack(s *memory.Subscription, ms ...*driver.Message) error {
	return s.Ack(context.Background(), ms)
}

func retry(s *memory.Subscription, delay time.Duration, ms ...*driver.Message) error {
	return s.Retry(context.Background(), ms, delay)
}

func deadLetter(s *memory.Subscription, m *driver.Message, cause error) error {
	return s.DeadLetter(context.Background(), []*driver.Message{m}, []error{cause})
}

func release(s *memory.Subscription, ms ...*driver.Message) error {
	return s.Release(context.Background(), ms)
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
		m := recv(t, s)
		if m.ID != want || string(m.Body) != "body-"+want || m.Headers["h"] != want || m.Key != "k-"+want {
			t.Fatalf("got %+v, want message %q", m, want)
		}
		if m.Source != "q" || m.System != "memory" || m.Attempt != 1 || m.ReceivedAt.IsZero() || m.AckID == nil || m.BrokerKey == nil {
			t.Fatalf("delivery fields: %+v", m)
		}
		if driver.MetadataOf(m.Metadata)[memory.MetaDeliverySeq] == "" || driver.MetadataOf(m.Metadata)[memory.MetaPublishSeq] == "" {
			t.Fatalf("metadata missing: %v", m.Metadata)
		}
		if err := ack(s, m); err != nil {
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

// TestReceiveReturnsAtMostMax: Receive hands out what is ready, in order,
// never more than asked, without waiting for more; one Ack settles them
// all.
func TestReceiveReturnsAtMostMax(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", ids(5)...)
	first := recvN(t, s, 2)
	rest := recvN(t, s, 10)
	var got []string
	for _, m := range append(first, rest...) {
		got = append(got, m.ID)
	}
	if len(first) != 2 || !slices.Equal(got, ids(5)) {
		t.Fatalf("Receive(2) then Receive(10) = %d then %v, want 2 then all five in order", len(first), got)
	}
	if st := b.Stats("q"); st.InFlight != 5 || st.Ready != 0 {
		t.Fatalf("stats = %+v", st)
	}
	if err := ack(s, append(first, rest...)...); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if st := b.Stats("q"); st.Acked != 5 || b.Len("q") != 0 {
		t.Fatalf("stats = %+v", st)
	}
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
	if string(d.Body) != "xyz" || d.Headers["h"] != "1" {
		t.Fatalf("broker kept the producer's buffers: %+v", d)
	}
	// A consumer changing its copy does not change the redelivery.
	d.ID = "changed"
	d.Body[0] = 'Q'
	if err := retry(s, 0, d); err != nil {
		t.Fatal(err)
	}
	d2 := recv(t, s)
	if d2.ID != "a" || string(d2.Body) != "xyz" {
		t.Fatalf("redelivery changed by the consumer: %+v", d2)
	}
}

func TestEmptyIDIsDelivered(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "")
	m := recv(t, s)
	if m.ID != "" {
		t.Fatalf("ID = %q", m.ID)
	}
	if err := deadLetter(s, m, core.ErrMissingID); err != nil {
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
	m := recv(t, s)
	const delay = 80 * time.Millisecond
	start := time.Now()
	if err := retry(s, delay, m); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	if st := b.Stats("q"); st.Delayed != 1 || st.InFlight != 0 || st.Retried != 1 {
		t.Fatalf("stats after retry = %+v", st)
	}
	if b.Len("q") != 1 {
		t.Fatalf("Len = %d, want 1 (delayed counts)", b.Len("q"))
	}
	noRecv(t, s, delay/2)
	m2 := recv(t, s)
	if el := time.Since(start); el < delay {
		t.Fatalf("redelivered after %v, want >= %v", el, delay)
	}
	if m2.ID != "a" || m2.Attempt != 2 {
		t.Fatalf("redelivery = %+v, want a at attempt 2", m2)
	}
	if err := retry(s, 0, m2); err != nil {
		t.Fatal(err)
	}
	if m3 := recv(t, s); m3.Attempt != 3 {
		t.Fatalf("attempt = %d, want 3", m3.Attempt)
	}
}

func TestRetryGoesBehindReadyMessages(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a", "b")
	if err := retry(s, 0, recv(t, s)); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, s).ID; got != "b" {
		t.Fatalf("got %q, want b before the retried a", got)
	}
	if got := recv(t, s); got.ID != "a" || got.Attempt != 2 {
		t.Fatalf("got %+v, want a at attempt 2", got)
	}
}

// TestReleaseRequeuesToTheFront: what the Consumer gives back undecided
// when it stops goes to the front of the queue at once, in the order it
// was delivered, ahead of what was ready; a retry goes to the back.
func TestReleaseRequeuesToTheFront(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a", "b", "c")
	ms := recvN(t, s, 2) // a, b
	if err := release(s, ms[1], ms[0]); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for _, want := range []struct {
		id      string
		attempt int
	}{{"a", 2}, {"b", 2}, {"c", 1}} {
		m := recv(t, s)
		if m.ID != want.id || m.Attempt != want.attempt {
			t.Fatalf("got %s attempt %d, want %s attempt %d", m.ID, m.Attempt, want.id, want.attempt)
		}
		if err := ack(s, m); err != nil {
			t.Fatal(err)
		}
	}
	if st := b.Stats("q"); st.Requeued != 2 || st.Acked != 3 || st.Retried != 0 {
		t.Fatalf("stats = %+v", st)
	}
	// A released message is no longer leased: releasing it again is stale.
	err := release(s, ms[0])
	var p *driver.Partial
	if !errors.As(err, &p) || !errors.Is(p.Errs[0], memory.ErrLeaseExpired) {
		t.Fatalf("second Release = %v, want a *driver.Partial with ErrLeaseExpired", err)
	}
}

func TestDeadLetterParksWithCauseAndRedrive(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a", "b")
	cause := core.Permanent(errors.New("bad payload"))
	if err := retry(s, 0, recv(t, s)); err != nil {
		t.Fatal(err)
	}
	if err := ack(s, recv(t, s)); err != nil { // b
		t.Fatal(err)
	}
	m := recv(t, s) // a, attempt 2
	if err := deadLetter(s, m, cause); err != nil {
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
	m = recv(t, s)
	if m.ID != "a" || m.Attempt != 1 {
		t.Fatalf("redriven = %+v, want a at attempt 1", m)
	}
	if err := deadLetter(s, m, nil); err != nil {
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
	if d2.ID != "a" || d2.Attempt != 2 {
		t.Fatalf("redelivery = %+v", d2)
	}
	// The stale lease's ack must not ack the newer copy still in flight.
	if err := ack(s1, d1); !errors.Is(err, memory.ErrLeaseExpired) || !errors.Is(err, driver.ErrStaleDelivery) {
		t.Fatalf("stale Ack = %v, want ErrLeaseExpired (a stale delivery)", err)
	}
	if st := b.Stats("q"); st.InFlight != 1 || st.Acked != 0 || st.Expired != 1 || st.StaleSettlements != 1 {
		t.Fatalf("stats after stale ack = %+v", st)
	}
	// Nor its retry or dead letter: the broker refuses each, and the newer
	// copy stays in flight.
	for _, err := range []error{retry(s1, 0, d1), deadLetter(s1, d1, errors.New("x"))} {
		if !errors.Is(err, memory.ErrLeaseExpired) {
			t.Fatalf("settling a stale delivery again = %v, want ErrLeaseExpired", err)
		}
	}
	if st := b.Stats("q"); st.InFlight != 1 || st.Retried != 0 || st.DeadLettered != 0 || st.StaleSettlements != 3 {
		t.Fatalf("stats after stale settlements = %+v", st)
	}
	if err := ack(s2, d2); err != nil {
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
	if err := retry(s, time.Hour, da); !errors.Is(err, memory.ErrLeaseExpired) {
		t.Fatalf("stale Retry = %v", err)
	}
	if err := deadLetter(s, db, errors.New("x")); !errors.Is(err, memory.ErrLeaseExpired) {
		t.Fatalf("stale DeadLetter = %v", err)
	}
	if st := b.Stats("q"); st.Ready != 2 || st.Delayed != 0 || st.DeadLetters != 0 {
		t.Fatalf("stale settlements changed the queue: %+v", st)
	}
}

// TestSettledDeliveryIsNoLongerLeased: once acked, a delivery is no
// longer the broker's lease of its message; a later settlement of it
// (which the Consumer never sends: see TestSettleTwice) is refused as
// stale and changes nothing.
func TestSettledDeliveryIsNoLongerLeased(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	m := recv(t, s)
	if err := ack(s, m); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Ack": ack(s, m), "Retry": retry(s, 0, m), "DeadLetter": deadLetter(s, m, errors.New("x")), "Release": release(s, m),
	} {
		if !errors.Is(err, memory.ErrLeaseExpired) {
			t.Errorf("%s after Ack = %v, want ErrLeaseExpired", name, err)
		}
	}
	if st := b.Stats("q"); st.Acked != 1 || st.Retried != 0 || st.DeadLettered != 0 || st.Requeued != 0 || b.Len("q") != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestSettleWithDoneContextSettlesNothing(t *testing.T) {
	b := newBroker(t)
	s := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	m := recv(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	one := []*driver.Message{m}
	for name, err := range map[string]error{
		"Ack": s.Ack(ctx, one), "Retry": s.Retry(ctx, one, 0), "DeadLetter": s.DeadLetter(ctx, one, []error{errors.New("x")}),
		"Release": s.Release(ctx, one),
	} {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s = %v, want context.Canceled", name, err)
		}
	}
	if st := b.Stats("q"); st.InFlight != 1 || st.Acked+st.Retried+st.DeadLettered+st.Requeued != 0 {
		t.Fatalf("a cancelled settlement changed the queue: %+v", st)
	}
	if err := ack(s, m); err != nil {
		t.Fatalf("Ack after a cancelled attempt: %v", err)
	}
}

func TestCrashRedeliversEverythingInFlight(t *testing.T) {
	b := newBroker(t) // 30s visibility: only the crash can bring them back
	s1 := subscribe(t, b, "q")
	s2 := subscribe(t, b, "q")
	publish(t, b, "q", "a", "b", "c", "d")
	da, db, dc := recv(t, s1), recv(t, s1), recv(t, s1)
	if err := ack(s1, da); err != nil {
		t.Fatal(err)
	}
	s1.Crash()
	if _, err := s1.Receive(context.Background(), 1); !errors.Is(err, memory.ErrCrashed) || !errors.Is(err, core.ErrSourceClosed) {
		t.Fatalf("Receive after crash = %v, want ErrCrashed wrapping core.ErrSourceClosed", err)
	}
	for _, m := range []*driver.Message{db, dc} {
		if err := ack(s1, m); !errors.Is(err, memory.ErrCrashed) || !errors.Is(err, driver.ErrStaleDelivery) {
			t.Fatalf("Ack after crash = %v, want ErrCrashed (a stale delivery)", err)
		}
	}
	// Requeued at the front, in delivery order, with the next attempt.
	for _, want := range []string{"b", "c"} {
		m := recv(t, s2)
		if m.ID != want || m.Attempt != 2 {
			t.Fatalf("got %s attempt %d, want %s attempt 2", m.ID, m.Attempt, want)
		}
	}
	if m := recv(t, s2); m.ID != "d" || m.Attempt != 1 {
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
		_, err := s.Receive(context.Background(), 1)
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

func TestLostAckIsRequeuedByCrash(t *testing.T) {
	b := newBroker(t, memory.WithFaults(memory.Faults{LoseAck: 1}))
	s1 := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	if err := ack(s1, recv(t, s1)); err != nil {
		t.Fatal(err)
	}
	s1.Crash() // the broker still held the lease: the connection drop returns it
	s2 := subscribe(t, b, "q")
	if m := recv(t, s2); m.ID != "a" || m.Attempt != 2 {
		t.Fatalf("got %+v", m)
	}
}

func TestCrashOnAck(t *testing.T) {
	b := newBroker(t, memory.WithFaults(memory.Faults{CrashOnAck: 1}))
	s1 := subscribe(t, b, "q")
	publish(t, b, "q", "a", "b")
	da, db := recv(t, s1), recv(t, s1)
	if err := ack(s1, da); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Ack = %v, want ErrCrashed", err)
	}
	if err := ack(s1, db); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Ack after crash = %v, want ErrCrashed", err)
	}
	if _, err := s1.Receive(context.Background(), 1); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Receive = %v", err)
	}
	b.SetFaults(memory.Faults{})
	s2 := subscribe(t, b, "q")
	for _, want := range []string{"a", "b"} {
		m := recv(t, s2)
		if m.ID != want || m.Attempt != 2 {
			t.Fatalf("got %s attempt %d, want %s attempt 2", m.ID, m.Attempt, want)
		}
		if err := ack(s2, m); err != nil {
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
	for left := b.Len("payments"); left > 0; {
		ms := recvN(t, s, 100)
		for _, m := range ms {
			seen[m.ID]++
		}
		if err := ack(s, ms...); err != nil {
			t.Fatal(err)
		}
		left -= len(ms)
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

func TestReceiveRespectsContextAndPassesWakeups(t *testing.T) {
	b := newBroker(t)
	s1 := subscribe(t, b, "q")
	s2 := subscribe(t, b, "q")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := s1.Receive(ctx, 1)
		errc <- err
	}()
	got := make(chan string, 1)
	go func() {
		ms, err := s2.Receive(context.Background(), 1)
		if err != nil {
			t.Error(err)
			got <- ""
			return
		}
		got <- ms[0].ID
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
	if err := ack(s1, da); !errors.Is(err, memory.ErrSubscriptionClosed) || !errors.Is(err, driver.ErrStaleDelivery) {
		t.Fatalf("Ack after Close = %v, want ErrSubscriptionClosed (a stale delivery)", err)
	}
	if _, err := s1.Receive(context.Background(), 1); !errors.Is(err, memory.ErrSubscriptionClosed) || !errors.Is(err, core.ErrSourceClosed) {
		t.Fatalf("Receive after Close = %v", err)
	}
	s2 := subscribe(t, b, "q")
	if m := recv(t, s2); m.ID != "a" || m.Attempt != 2 {
		t.Fatalf("got %+v", m)
	}
	if st := b.Stats("q"); st.Requeued != 1 || st.Crashes != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

// TestAckSettlesTheWholeCall: one Ack settles every message of the call,
// as an AMQP multiple ack or an SQS DeleteMessageBatch does; a message of
// another subscription fails the whole call before anything is settled,
// and a stale one fails alone (a *driver.Partial says which).
func TestAckSettlesTheWholeCall(t *testing.T) {
	b := newBroker(t, memory.WithVisibilityTimeout(40*time.Millisecond))
	s := subscribe(t, b, "q")
	other := subscribe(t, b, "q")
	publish(t, b, "q", ids(5)...)
	ms := recvN(t, s, 3)
	if len(ms) != 3 {
		t.Fatalf("received %d, want 3", len(ms))
	}
	foreign := recv(t, other)
	mixed := append(ms[:2:2], foreign)
	for name, err := range map[string]error{
		"Ack": ack(s, mixed...), "Retry": retry(s, 0, mixed...), "Release": release(s, mixed...),
		"DeadLetter": s.DeadLetter(context.Background(), mixed, make([]error, len(mixed))),
	} {
		if !errors.Is(err, memory.ErrForeignDelivery) || !strings.Contains(err.Error(), "ms[2]") {
			t.Fatalf("%s with a foreign message = %v, want ErrForeignDelivery naming ms[2]", name, err)
		}
	}
	if st := b.Stats("q"); st.Acked+st.Retried+st.DeadLettered+st.Requeued != 0 {
		t.Fatalf("a call with a foreign message settled something: %+v", st)
	}
	if err := ack(s, ms...); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if st := b.Stats("q"); st.Acked != 3 || st.InFlight != 1 {
		t.Fatalf("stats = %+v", st)
	}
	// Partial: one stale, one fresh.
	stale := recv(t, s)
	eventually(t, "the leases to expire", func() bool { return b.Stats("q").Expired == 2 })
	fresh := recv(t, s)
	err := ack(s, stale, fresh)
	var p *driver.Partial
	if !errors.As(err, &p) || len(p.Errs) != 2 || !errors.Is(p.Errs[0], memory.ErrLeaseExpired) || p.Errs[1] != nil {
		t.Fatalf("Ack = %v, want a *driver.Partial with ErrLeaseExpired for ms[0] only", err)
	}
	if st := b.Stats("q"); st.Acked != 4 {
		t.Fatalf("fresh message in a partial call not acked: %+v", st)
	}
}

func TestAckFaults(t *testing.T) {
	b := newBroker(t, memory.WithFaults(memory.Faults{LoseAck: 1}))
	s := subscribe(t, b, "q")
	publish(t, b, "q", ids(3)...)
	if err := ack(s, recvN(t, s, 3)...); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats("q"); st.AcksLost != 3 || st.InFlight != 3 || st.Acked != 0 {
		t.Fatalf("lost batch: %+v", st)
	}
	b.SetFaults(memory.Faults{CrashOnAck: 1})
	s2 := subscribe(t, b, "q")
	publish(t, b, "q", "x")
	if err := ack(s2, recv(t, s2)); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Ack = %v, want ErrCrashed", err)
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
			ms, err := s.Receive(context.Background(), 1)
			if err != nil {
				return
			}
			if i%5 == 0 && ms[0].Attempt == 1 {
				retry(s, 5*time.Millisecond, ms...)
				continue
			}
			time.Sleep(time.Millisecond)
			// Counted before the ack: WaitIdle may return as soon as the
			// last ack lands, before Ack returns here.
			acked.Add(1)
			ack(s, ms...)
		}
		for {
			ms, err := s.Receive(context.Background(), 1)
			if err != nil {
				return
			}
			acked.Add(1)
			ack(s, ms...)
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
		s := subscribe(t, b, "q")
		wg.Go(func() {
			for {
				ms, err := s.Receive(ctx, 8)
				if err != nil {
					return
				}
				mu.Lock()
				for _, m := range ms {
					key := driver.MetadataOf(m.Metadata)[memory.MetaPublishSeq]
					if h, ok := holding[key]; ok {
						t.Errorf("%s held by %d and %d at once", key, h, i)
					}
					holding[key] = i
					counts[m.ID]++
					perSub[i]++
				}
				mu.Unlock()
				time.Sleep(50 * time.Microsecond) // work, so that the others get a share
				mu.Lock()
				for _, m := range ms {
					delete(holding, driver.MetadataOf(m.Metadata)[memory.MetaPublishSeq])
				}
				mu.Unlock()
				if err := s.Ack(ctx, ms); err != nil {
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
				ms, err := s.Receive(ctx, 1)
				if err != nil {
					return
				}
				d := ms[0]
				id := d.ID
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
				holding[id] = append(holding[id], d.ReceivedAt)
				outlive := (i+j)%7 == 0 && d.Attempt == 1
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
				err = ack(s, d) // settle even after cancel
				mu.Lock()
				if k := slices.Index(holding[id], d.ReceivedAt); k >= 0 {
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
	if err := retry(s, 20*time.Millisecond, d2); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 2)
	go func() { _, err := s.Receive(context.Background(), 1); errc <- err }()
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
	if err := ack(s, d); !errors.Is(err, memory.ErrBrokerClosed) {
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
	other := subscribe(t, b, "q")
	publish(t, b, "q", "a")
	d := recv(t, s)
	retry(s, 0, d)
	d2 := recv(t, other)
	m1, m2 := driver.MetadataOf(d.Metadata), driver.MetadataOf(d2.Metadata)
	if m1[memory.MetaPublishSeq] != m2[memory.MetaPublishSeq] {
		t.Fatalf("publish seq changed across redelivery: %v %v", m1, m2)
	}
	s1, _ := strconv.Atoi(m1[memory.MetaDeliverySeq])
	s2, _ := strconv.Atoi(m2[memory.MetaDeliverySeq])
	if s2 <= s1 {
		t.Fatalf("delivery seq not increasing: %v %v", m1, m2)
	}
	if m1[memory.MetaSubscriber] == "" || m1[memory.MetaSubscriber] == m2[memory.MetaSubscriber] {
		t.Fatalf("subscriber not told apart: %v %v", m1, m2)
	}
	// Every value is an integer, as tracing records it.
	n := 0
	for k, v := range d.Metadata.All() {
		n++
		if v.Kind() != slog.KindUint64 {
			t.Errorf("%s is a %v, want an unsigned integer", k, v.Kind())
		}
	}
	if n != 3 {
		t.Errorf("%d metadata keys, want 3", n)
	}
}

// lostAcks acks n messages in calls of up to batch with the LoseAck
// fault and returns which ids lost their ack.
func lostAcks(t *testing.T, seed uint64, n, batch int) map[string]bool {
	b := newBroker(t, memory.WithSeed(seed), memory.WithFaults(memory.Faults{LoseAck: 0.1}))
	publish(t, b, "q", ids(n)...)
	s := subscribe(t, b, "q")
	for left := n; left > 0; {
		ms := recvN(t, s, batch)
		if err := ack(s, ms...); err != nil {
			t.Fatal(err)
		}
		left -= len(ms)
	}
	st := b.Stats("q")
	if st.AcksLost+st.Acked != int64(n) || st.InFlight != int(st.AcksLost) {
		t.Fatalf("stats = %+v", st)
	}
	s.Crash() // requeue the lost ones to see which they were
	s2 := subscribe(t, b, "q")
	lost := map[string]bool{}
	for range st.AcksLost {
		lost[recv(t, s2).ID] = true
	}
	return lost
}

func TestAckFaultRatesArePerMessageAndSeeded(t *testing.T) {
	const n = 2000
	a := lostAcks(t, 7, n, 100)
	if got := float64(len(a)) / n; got < 0.07 || got > 0.13 {
		t.Fatalf("lost-ack rate %.3f in calls of 100, want about 0.1", got)
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
			s, err := b.Subscribe(queue)
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				for i := 0; ; i++ {
					ms, err := s.Receive(context.Background(), 1)
					if err != nil {
						return // the broker closed
					}
					switch i % 3 {
					case 0:
						retry(s, time.Hour, ms...) // a timer far away
					case 1:
						ack(s, ms...)
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

// TestURLParameters: mem:// URLs take the broker's name and visibility
// timeout; the window is the Consumer's, so a window parameter is refused,
// naming it.
func TestURLParameters(t *testing.T) {
	ctx := context.Background()
	src, err := core.OpenSource(ctx, "mem://q?broker=TestURLParameters&visibility=45s")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if tr, err := src.Start(ctx, driver.Setup{Window: 1}); err != nil || tr.Lease != 45*time.Second {
		t.Fatalf("Start = %+v, %v; want a Lease of 45s", tr, err)
	}
	for _, tc := range []struct{ url, names string }{
		{"mem://q?window=5", `"window"`},
		{"mem://q?visibility=0s", "visibility"},
		{"mem://", "queue"},
	} {
		if src, err := core.OpenSource(ctx, tc.url); err == nil {
			src.Close()
			t.Errorf("OpenSource(%s) succeeded", tc.url)
		} else if !strings.Contains(err.Error(), tc.names) {
			t.Errorf("OpenSource(%s) = %v, want an error naming %s", tc.url, err, tc.names)
		}
	}
}
