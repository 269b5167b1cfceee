package inflight_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/inflight"
	"github.com/idemq/idemq/internal/servicetest"
)

// leased is a memory subscription that reports its broker's visibility as
// a lease and extends it through extend, with the traits a test sets, so
// the flow's bookkeeping runs against a real at-least-once broker.
type leased struct {
	*memory.Subscription
	traits driver.Traits
	extend func(ctx context.Context, ms []*driver.Message) error

	mu        sync.Mutex
	abandoned []string
	released  []string
	retries   []time.Time
}

func (l *leased) Start(ctx context.Context, s driver.Setup) (driver.Traits, error) {
	return l.traits, nil
}

// Extend extends through l.extend; without one it fails, as a broker that
// cannot be reached does.
func (l *leased) Extend(ctx context.Context, ms []*driver.Message) error {
	if l.extend == nil {
		return errors.New("no extension")
	}
	return l.extend(ctx, ms)
}

func (l *leased) Abandon(_ context.Context, ms []*driver.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range ms {
		l.abandoned = append(l.abandoned, m.ID)
	}
}

func (l *leased) Release(ctx context.Context, ms []*driver.Message) error {
	l.mu.Lock()
	for _, m := range ms {
		l.released = append(l.released, m.ID)
	}
	l.mu.Unlock()
	return l.Subscription.Release(ctx, ms)
}

func (l *leased) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	l.mu.Lock()
	l.retries = append(l.retries, time.Now())
	l.mu.Unlock()
	return l.Subscription.Retry(ctx, ms, delay)
}

func (l *leased) snapshot() (abandoned, released []string, retries []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.abandoned...), append([]string(nil), l.released...), append([]time.Time(nil), l.retries...)
}

func broker(t *testing.T, visibility time.Duration, ids ...string) *memory.Broker {
	t.Helper()
	b, err := memory.NewBroker(memory.WithVisibilityTimeout(visibility))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	for _, id := range ids {
		if err := b.Publish(context.Background(), "q", &driver.Message{ID: id, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func subscribe(t *testing.T, b *memory.Broker) *memory.Subscription {
	t.Helper()
	s, err := b.Subscribe("q")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// A message whose lease passed while held is stale: its settlement sends
// nothing (the broker redelivers it), and an Abandoner is told.
func TestLapsedLeaseIsStaleAndAbandoned(t *testing.T) {
	b := broker(t, 200*time.Millisecond, "a")
	l := &leased{Subscription: subscribe(t, b), traits: driver.Traits{Lease: 200 * time.Millisecond, DelaysRetry: true}}
	r := brokertest.StartReceiver(t, l, 1)
	d, err := r.Receive(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	servicetest.WaitFor(t, 5*time.Second, "the lapsed message to be abandoned", func() bool {
		a, _, _ := l.snapshot()
		return len(a) == 1 && a[0] == "a"
	})
	if err := d.Ack(ctx(t)); !errors.Is(err, driver.ErrStaleDelivery) || !errors.Is(err, inflight.ErrLeaseLapsed) {
		t.Fatalf("Ack after the lease lapsed = %v, want a stale error naming the lapse", err)
	}
	if st := b.Stats("q"); st.Acked != 0 || st.StaleSettlements != 0 {
		t.Fatalf("broker %+v: a stale Ack reached the broker", st)
	}
	again, err := r.Receive(ctx(t))
	if err != nil || again.Message().ID != "a" || again.Message().Attempt != 2 {
		t.Fatalf("after the lapse received %v (%v), want a's second delivery", again, err)
	}
	if err := again.Ack(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

// A lease extended in time does not lapse; an extension the source
// refused does not count, and the lease lapses on the broker's clock.
func TestExtensionCountsOnlyWhenConfirmed(t *testing.T) {
	const lease = 300 * time.Millisecond
	b := broker(t, time.Hour, "kept", "refused")
	var calls atomic.Int64
	l := &leased{Subscription: subscribe(t, b), traits: driver.Traits{Lease: lease, DelaysRetry: true}}
	l.extend = func(_ context.Context, ms []*driver.Message) error {
		calls.Add(1)
		errs := make([]error, len(ms))
		for i, m := range ms {
			if m.ID == "refused" {
				errs[i] = errors.New("broker unreachable")
			}
		}
		return driver.PartialOf(errs)
	}
	r := brokertest.StartReceiver(t, l, 2)
	kept, _ := r.Receive(ctx(t))
	refused, _ := r.Receive(ctx(t))
	if kept.Message().ID != "kept" {
		kept, refused = refused, kept
	}
	time.Sleep(3 * lease)
	if calls.Load() < 3 {
		t.Fatalf("Extend called %d times over three leases, want a beat every third of one", calls.Load())
	}
	if err := kept.Ack(ctx(t)); err != nil {
		t.Errorf("Ack of the extended message = %v, want nil", err)
	}
	if err := refused.Ack(ctx(t)); !errors.Is(err, inflight.ErrLeaseLapsed) {
		t.Errorf("Ack of the message whose extensions failed = %v, want its lease lapsed", err)
	}
}

// Past MaxExtension a held message is no longer extended and lapses.
func TestMaxExtensionBoundsExtension(t *testing.T) {
	const lease = 200 * time.Millisecond
	b := broker(t, time.Hour, "slow")
	l := &leased{Subscription: subscribe(t, b), traits: driver.Traits{Lease: lease, MaxExtension: 400 * time.Millisecond, DelaysRetry: true}}
	l.extend = func(context.Context, []*driver.Message) error { return nil }
	r := brokertest.StartReceiver(t, l, 1)
	d, _ := r.Receive(ctx(t))
	time.Sleep(400*time.Millisecond + 2*lease)
	if err := d.Ack(ctx(t)); !errors.Is(err, inflight.ErrLeaseLapsed) {
		t.Fatalf("Ack after MaxExtension and a lease = %v, want the lease lapsed", err)
	}
}

// A newer delivery of a message the flow holds supersedes the older one,
// whose settlement is stale; the newer settles it.
func TestRedeliverySupersedes(t *testing.T) {
	b := broker(t, 100*time.Millisecond, "a")
	r := brokertest.StartReceiver(t, subscribe(t, b), 2)
	first, _ := r.Receive(ctx(t))
	second, err := r.Receive(ctx(t)) // after the broker's visibility passed
	if err != nil || second.Message().ID != "a" {
		t.Fatalf("second receive: %v %v", second, err)
	}
	if err := first.Ack(ctx(t)); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Fatalf("Ack of the superseded delivery = %v, want a stale error", err)
	}
	if err := second.Ack(ctx(t)); err != nil {
		t.Fatalf("Ack of the newer delivery = %v", err)
	}
	if st := b.Stats("q"); st.Acked != 1 {
		t.Fatalf("broker %+v, want the message acked once", st)
	}
}

// A source that cannot delay a Retry gets it after the delay, with no
// delay of its own, and the message keeps its room in the window
// meanwhile.
func TestRetryDelayKeptForASourceThatCannot(t *testing.T) {
	b := broker(t, time.Hour, "a", "b")
	l := &leased{Subscription: subscribe(t, b)}
	r := brokertest.StartReceiver(t, l, 1)
	d, _ := r.Receive(ctx(t))
	const delay = 300 * time.Millisecond
	start := time.Now()
	if err := d.Retry(ctx(t), delay); err != nil {
		t.Fatal(err)
	}
	// The window of one is still taken: nothing else arrives before the
	// retry is sent.
	next, err := r.Receive(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	_, _, retries := l.snapshot()
	if len(retries) != 1 || retries[0].Sub(start) < delay {
		t.Fatalf("Retry sent at %v, want one call after the %v delay", retries, delay)
	}
	if time.Since(start) < delay {
		t.Fatalf("the next message came after %v, before the retry's delay freed its room", time.Since(start))
	}
	_ = next.Ack(ctx(t))
}

// Close releases what is held, retries still waiting out their delay
// included; settling a released message afterwards is stale.
func TestCloseReleasesHeldAndWaiting(t *testing.T) {
	b := broker(t, time.Hour, "held", "waiting")
	l := &leased{Subscription: subscribe(t, b)}
	r, err := brokertest.NewReceiver(context.Background(), l, 2, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := r.Receive(ctx(t))
	d2, _ := r.Receive(ctx(t))
	waiting, held := d1, d2
	if d1.Message().ID != "waiting" {
		waiting, held = d2, d1
	}
	if err := waiting.Retry(ctx(t), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	_, released, retries := l.snapshot()
	if len(released) != 2 || len(retries) != 0 {
		t.Fatalf("released %v and retried %d times, want both released and no retry", released, len(retries))
	}
	if err := held.Ack(ctx(t)); !errors.Is(err, driver.ErrStaleDelivery) || !errors.Is(err, inflight.ErrClosed) {
		t.Fatalf("Ack after Close = %v, want stale (closed)", err)
	}
	if st := b.Stats("q"); st.Ready != 2 || st.Requeued != 2 {
		t.Fatalf("broker %+v, want both requeued and ready", st)
	}
}

// The window bounds what is asked of the source and held.
func TestWindowBoundsWhatIsAsked(t *testing.T) {
	b := broker(t, time.Hour, "a", "b", "c", "d", "e")
	s := &counting{Subscription: subscribe(t, b)}
	f, err := inflight.Start(context.Background(), s, inflight.Config{Window: 3, Logger: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(context.Background()) })
	hs, err := f.Fetch(ctx(t), 10)
	if err != nil || len(hs) != 3 || s.maxAsked.Load() != 3 {
		t.Fatalf("fetched %d (%v), asked for %d; want 3 of a window of 3", len(hs), err, s.maxAsked.Load())
	}
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := f.Fetch(short, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fetch with a full window = %v, want it to wait", err)
	}
	f.Settle(ctx(t), []inflight.Settlement{{H: hs[0], Kind: inflight.Ack}}, nil)
	if more, err := f.Fetch(ctx(t), 10); err != nil || len(more) != 1 || s.lastAsked.Load() != 1 {
		t.Fatalf("after one ack fetched %d (%v), asked %d; want 1", len(more), err, s.lastAsked.Load())
	}
}

type counting struct {
	*memory.Subscription
	maxAsked, lastAsked atomic.Int64
}

func (c *counting) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	c.lastAsked.Store(int64(max))
	if int64(max) > c.maxAsked.Load() {
		c.maxAsked.Store(int64(max))
	}
	return c.Subscription.Receive(ctx, max)
}

// Of concurrent settlements of one message exactly one is sent; the others
// get driver.ErrAlreadySettled.
func TestConcurrentSettlementsSettleOnce(t *testing.T) {
	b := broker(t, time.Hour, "a")
	r := brokertest.StartReceiver(t, subscribe(t, b), 1)
	d, err := r.Receive(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var wins, refused atomic.Int32
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				err = d.Ack(ctx(t))
			} else {
				err = d.DeadLetter(ctx(t), errors.New("poison"))
			}
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, driver.ErrAlreadySettled):
				refused.Add(1)
			default:
				t.Errorf("settlement: %v, want nil or driver.ErrAlreadySettled", err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 || refused.Load() != 15 {
		t.Fatalf("%d settlements won, %d refused; want exactly one", wins.Load(), refused.Load())
	}
	if st := b.Stats("q"); st.Acked+st.DeadLettered != 1 {
		t.Fatalf("broker %+v: want the message settled once", st)
	}
}

// An Abandoner is told, once, of a message found stale when its decision
// came (superseded by a redelivery), not only of lapses the beat saw.
func TestAbandonerToldOfStaleAtSettlement(t *testing.T) {
	b := broker(t, 100*time.Millisecond, "a")
	l := &leased{Subscription: subscribe(t, b), traits: driver.Traits{DelaysRetry: true}}
	r := brokertest.StartReceiver(t, l, 2)
	first, _ := r.Receive(ctx(t))
	second, _ := r.Receive(ctx(t)) // after the broker's visibility passed
	if err := first.Ack(ctx(t)); !errors.Is(err, inflight.ErrRedelivered) {
		t.Fatalf("Ack of the superseded delivery = %v, want it superseded", err)
	}
	if err := first.Ack(ctx(t)); !errors.Is(err, driver.ErrAlreadySettled) {
		t.Fatalf("second Ack = %v", err)
	}
	if a, _, _ := l.snapshot(); len(a) != 1 || a[0] != "a" {
		t.Fatalf("abandoned %v, want the superseded delivery once", a)
	}
	_ = second.Ack(ctx(t))
}

// With a ReceiveLinger the flow waits for room for a whole MaxBatch before
// it receives, rather than asking for one message as soon as one is
// settled.
func TestReceiveLingerWaitsForRoom(t *testing.T) {
	b := broker(t, time.Hour, "a", "b", "c", "d", "e", "f", "g", "h")
	s := &counting{Subscription: subscribe(t, b)}
	l := &lingering{counting: s}
	f, err := inflight.Start(context.Background(), l, inflight.Config{Window: 4, Logger: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(context.Background()) })
	hs, err := f.Fetch(ctx(t), 4)
	if err != nil || len(hs) != 4 {
		t.Fatalf("fetched %d (%v), want 4", len(hs), err)
	}
	go func() {
		for _, h := range hs {
			time.Sleep(20 * time.Millisecond)
			f.Settle(context.Background(), []inflight.Settlement{{H: h, Kind: inflight.Ack}}, nil)
		}
	}()
	more, err := f.Fetch(ctx(t), 4)
	if err != nil || s.lastAsked.Load() != 4 || len(more) != 4 {
		t.Fatalf("after acks 20ms apart asked for %d and got %d (%v), want the whole batch of 4", s.lastAsked.Load(), len(more), err)
	}
}

// lingering is a source whose receives want a whole batch.
type lingering struct{ *counting }

func (l *lingering) Start(context.Context, driver.Setup) (driver.Traits, error) {
	return driver.Traits{MaxBatch: 4, DelaysRetry: true, ReceiveLinger: time.Second}, nil
}
