// Package outboxtest holds the tests that every outbox store passes the
// same way: parking rows that cannot be published, and the operator's
// work on them.
package outboxtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/outbox"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Env is an outbox table for one test.
type Env struct {
	// Store is the table's relay side; it implements outbox.Operator.
	Store outbox.Store
	// Write commits msgs to the table in one transaction.
	Write func(ctx context.Context, msgs ...*outbox.Message) error
}

// ErrTooLarge is what the Publisher rejects the poison message with.
var ErrTooLarge = errors.New("message too large for the broker")

// Publisher records what it published and rejects every message whose
// body is "poison" (the whole publish call fails, as a broker's batch
// does) until Fix.
type Publisher struct {
	// Permanent marks the rejection driver.Permanent, as a broker's answer
	// that no retry can change.
	Permanent bool
	// Partial publishes the other messages of a call with a poison one and
	// returns a *driver.Partial, as a broker that took a call's records
	// in several requests does.
	Partial bool

	mu    sync.Mutex
	ids   []string
	fixed bool
}

// Publish implements driver.Publisher.
func (p *Publisher) Publish(_ context.Context, dest string, msgs ...*driver.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if string(m.Body) == "poison" && !p.fixed {
			errs[i] = fmt.Errorf("publish to %s: %w", dest, ErrTooLarge)
			if p.Permanent {
				errs[i] = driver.Permanent(errs[i])
			}
			if !p.Partial {
				return errs[i]
			}
		}
	}
	for i, m := range msgs {
		if errs[i] == nil {
			p.ids = append(p.ids, m.ID)
		}
	}
	if len(msgs) == 1 {
		return errs[0]
	}
	return driver.PartialOf(errs)
}

// Close implements driver.Publisher.
func (p *Publisher) Close() error { return nil }

// Fix makes the poison message publishable.
func (p *Publisher) Fix() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fixed = true
}

// IDs returns the ids published so far, in publish order.
func (p *Publisher) IDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.ids)
}

// maxAttempts is the tests' WithMaxAttempts.
const maxAttempts = 3

// messages are the tests' rows: key k1's head A is the poison, B and C
// follow it; D (key k2) and E (no key) are unrelated.
func messages() []*outbox.Message {
	m := func(id, key, body string) *outbox.Message {
		return &outbox.Message{ID: id, Key: key, Destination: "orders", Body: []byte(body)}
	}
	return []*outbox.Message{m("A", "k1", "poison"), m("B", "k1", "b"), m("C", "k1", "c"), m("D", "k2", "d"), m("E", "", "e")}
}

// Parking runs the parking tests on tables newEnv creates: HoldKey holds
// the poisoned key until a redrive publishes it in order, SkipParked lets
// the key flow and purge deletes the parked row, a table of the schema
// before parking (newEnv with old set) parks after Migrate, and with
// HoldKey a redriven row's key stops again at the next parked row; a
// rejection marked permanent parks at once, unless WithMaxAttempts is 0.
func Parking(t *testing.T, newEnv func(t *testing.T, old bool) Env) {
	t.Run("HoldKey", func(t *testing.T) { holdKey(t, newEnv(t, false)) })
	t.Run("SkipParked", func(t *testing.T) { skipParked(t, newEnv(t, false)) })
	t.Run("MigratedTable", func(t *testing.T) { holdKey(t, newEnv(t, true)) })
	t.Run("HoldKeyBehindLaterParked", func(t *testing.T) { holdBehindLater(t, newEnv(t, false)) })
	t.Run("PermanentParksAtOnce", func(t *testing.T) { permanent(t, newEnv(t, false), newEnv(t, false)) })
	t.Run("PartialPublish", func(t *testing.T) { partial(t, newEnv(t, false)) })
}

func setup(t *testing.T, env Env, opts ...outbox.Option) (*outbox.Relay, *Publisher, outbox.Operator) {
	t.Helper()
	op, ok := env.Store.(outbox.Operator)
	if !ok {
		t.Fatalf("%T does not implement outbox.Operator", env.Store)
	}
	if err := env.Write(context.Background(), messages()...); err != nil {
		t.Fatal(err)
	}
	pub := &Publisher{}
	opts = append([]outbox.Option{outbox.WithMaxAttempts(maxAttempts), outbox.WithRetryBackoff(time.Millisecond, 5*time.Millisecond),
		outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	r, err := outbox.NewRelay(env.Store, pub, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r, pub, op
}

// relayUntil runs r until done holds, failing t after 10s.
func relayUntil(t *testing.T, r *outbox.Relay, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("relay never reached: %s (stats %+v)", what, r.Stats())
		}
		r.RunOnce(context.Background())
		time.Sleep(5 * time.Millisecond)
	}
}

// parkedAlone returns the one parked row of op, failing t unless exactly
// one row is parked; what names the row expected.
func parkedAlone(t *testing.T, op outbox.Operator, what string) outbox.ParkedRow {
	t.Helper()
	parked, err := op.Parked(context.Background(), outbox.ParkedFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 {
		t.Fatalf("parked %+v, want %s alone", parked, what)
	}
	return parked[0]
}

// checkParkedA checks that A alone is parked after attempts failed
// publishes, with its cause.
func checkParkedA(t *testing.T, op outbox.Operator, attempts int) outbox.ParkedRow {
	t.Helper()
	p := parkedAlone(t, op, "A")
	if p.ID != "A" || p.Key != "k1" || p.Destination != "orders" || p.Attempts != attempts ||
		!strings.Contains(p.Cause, ErrTooLarge.Error()) || p.BodySize != int64(len("poison")) ||
		time.Since(p.ParkedAt).Abs() > time.Minute || p.ParkedAt.Before(p.CreatedAt) {
		t.Fatalf("parked row %+v", p)
	}
	for _, f := range []outbox.ParkedFilter{{Seqs: []int64{p.Seq}}, {Key: "k1"}, {Cause: "too large"}, {Limit: 1}} {
		if got, err := op.Parked(context.Background(), f); err != nil || len(got) != 1 {
			t.Fatalf("Parked(%+v) = %+v, %v", f, got, err)
		}
	}
	for _, f := range []outbox.ParkedFilter{{Seqs: []int64{p.Seq + 100}}, {Key: "k2"}, {Cause: "no such text"}} {
		if got, err := op.Parked(context.Background(), f); err != nil || len(got) != 0 {
			t.Fatalf("Parked(%+v) = %+v, %v", f, got, err)
		}
	}
	return p
}

func stats(t *testing.T, op outbox.Operator) outbox.TableStats {
	t.Helper()
	st, err := op.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func holdKey(t *testing.T, env Env) {
	ctx := context.Background()
	r, pub, op := setup(t, env)
	relayUntil(t, r, "A parked, D and E published", func() bool {
		return r.Stats().Parked == 1 && len(pub.IDs()) == 2
	})
	// The key's later rows stay held however often the relay looks.
	for range 5 {
		if n, err := r.RunOnce(ctx); n != 0 || err != nil {
			t.Fatalf("RunOnce with the key held = %d, %v", n, err)
		}
	}
	if ids := pub.IDs(); !slices.Equal(ids, []string{"D", "E"}) {
		t.Fatalf("published %v, want D and E (B and C held behind A)", ids)
	}
	a := checkParkedA(t, op, maxAttempts)
	st := stats(t, op)
	if st.Pending != 2 || st.Parked != 1 || st.HeldKeys != 1 || st.HeldRows != 2 || st.OldestPending <= 0 {
		t.Fatalf("stats %+v, want B and C pending and held by A", st)
	}
	if parked, held := gauges(t, env.Store); parked != 1 || held != 1 {
		t.Fatalf("gauges parked_rows %d, held_keys %d; want 1 and 1", parked, held)
	}
	if n, err := op.Redrive(ctx, outbox.ParkedFilter{Key: "k2"}); n != 0 || err != nil {
		t.Fatalf("Redrive of another key = %d, %v", n, err)
	}

	pub.Fix()
	if n, err := op.Redrive(ctx, outbox.ParkedFilter{Seqs: []int64{a.Seq}}); n != 1 || err != nil {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	relayUntil(t, r, "all published", func() bool { return len(pub.IDs()) == 5 })
	for range 3 {
		r.RunOnce(ctx)
	}
	if ids := pub.IDs(); !slices.Equal(ids, []string{"D", "E", "A", "B", "C"}) {
		t.Fatalf("published %v, want D, E, then A, B, C in order, once each", ids)
	}
	if st := stats(t, op); st != (outbox.TableStats{}) {
		t.Fatalf("stats after the redrive %+v, want nothing left", st)
	}
}

func skipParked(t *testing.T, env Env) {
	ctx := context.Background()
	r, pub, op := setup(t, env, outbox.WithParkedKey(outbox.SkipParked))
	relayUntil(t, r, "A parked, the rest published", func() bool {
		return r.Stats().Parked == 1 && len(pub.IDs()) == 4
	})
	ids := pub.IDs()
	if !slices.Equal(slices.Sorted(slices.Values(ids)), []string{"B", "C", "D", "E"}) || slices.Index(ids, "B") > slices.Index(ids, "C") {
		t.Fatalf("published %v, want B, C (in order), D and E", ids)
	}
	a := checkParkedA(t, op, maxAttempts)
	if st := stats(t, op); st.Pending != 0 || st.Parked != 1 || st.HeldKeys != 0 || st.HeldRows != 0 {
		t.Fatalf("stats %+v, want A parked, nothing held", st)
	}
	if n, err := op.Purge(ctx, outbox.ParkedFilter{Cause: "other cause"}); n != 0 || err != nil {
		t.Fatalf("Purge of another cause = %d, %v", n, err)
	}
	if n, err := op.Purge(ctx, outbox.ParkedFilter{Seqs: []int64{a.Seq}}); n != 1 || err != nil {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	pub.Fix()
	for range 3 {
		r.RunOnce(ctx)
	}
	if got := pub.IDs(); len(got) != 4 {
		t.Fatalf("published %v after the purge, want A never", got)
	}
	if st := stats(t, op); st != (outbox.TableStats{}) {
		t.Fatalf("stats after the purge %+v, want nothing left", st)
	}
}

// permanent checks that a rejection marked permanent parks A at its first
// failure, however many attempts WithMaxAttempts allows, and that the
// rows of its publish call (published one by one first) follow as they
// would: D and E are published, B and C held. With WithMaxAttempts(0), on
// never, nothing is parked.
func permanent(t *testing.T, env, never Env) {
	r, pub, op := setup(t, env, outbox.WithMaxAttempts(100))
	pub.Permanent = true
	relayUntil(t, r, "A parked, D and E published", func() bool {
		return r.Stats().Parked == 1 && len(pub.IDs()) == 2
	})
	checkParkedA(t, op, 1)
	if ids := pub.IDs(); !slices.Equal(ids, []string{"D", "E"}) {
		t.Fatalf("published %v, want D and E (B and C held behind A)", ids)
	}

	r, pub, op = setup(t, never, outbox.WithMaxAttempts(0))
	pub.Permanent = true
	relayUntil(t, r, "A failed 5 times", func() bool { return r.Stats().PublishErrors >= 5 })
	if st := stats(t, op); r.Stats().Parked != 0 || st.Parked != 0 || st.Pending != 5 {
		t.Fatalf("stats %+v (relay %+v) with WithMaxAttempts(0), want nothing parked, all 5 pending", st, r.Stats())
	}
}

// partial publishes to a broker that takes a call's good messages and
// refuses the poison one: the relay parks A and publishes no message
// twice, and the redrive publishes A once.
func partial(t *testing.T, env Env) {
	r, pub, op := setup(t, env, outbox.WithMaxAttempts(100))
	pub.Permanent, pub.Partial = true, true
	relayUntil(t, r, "A parked, D and E published", func() bool {
		return r.Stats().Parked == 1 && slices.Contains(pub.IDs(), "D") && slices.Contains(pub.IDs(), "E")
	})
	for range 3 {
		r.RunOnce(context.Background())
	}
	p := checkParkedA(t, op, 1)
	ids := pub.IDs()
	if slices.Contains(ids, "A") || len(slices.Compact(slices.Sorted(slices.Values(ids)))) != len(ids) {
		t.Fatalf("published %v, want every id but A at most once", ids)
	}
	pub.Fix()
	if n, err := op.Redrive(context.Background(), outbox.ParkedFilter{Seqs: []int64{p.Seq}}); n != 1 || err != nil {
		t.Fatalf("Redrive A = %d, %v", n, err)
	}
	relayUntil(t, r, "A to E published", func() bool { return len(pub.IDs()) >= 5 })
	for range 3 {
		r.RunOnce(context.Background())
	}
	if got := pub.IDs(); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"A", "B", "C", "D", "E"}) {
		t.Fatalf("published %v, want A to E once each", got)
	}
}

// holdBehindLater parks A and B of one key (SkipParked lets B be tried),
// writes C, and redrives A alone: with HoldKey, A is published and C
// waits behind B until B is redriven too.
func holdBehindLater(t *testing.T, env Env) {
	ctx := context.Background()
	op := env.Store.(outbox.Operator)
	m := func(id, body string) *outbox.Message {
		return &outbox.Message{ID: id, Key: "k", Destination: "orders", Body: []byte(body)}
	}
	if err := env.Write(ctx, m("A", "poison"), m("B", "poison")); err != nil {
		t.Fatal(err)
	}
	pub := &Publisher{}
	quiet := outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	skip, err := outbox.NewRelay(env.Store, pub, outbox.WithMaxAttempts(1), outbox.WithParkedKey(outbox.SkipParked),
		outbox.WithRetryBackoff(time.Millisecond, 5*time.Millisecond), quiet)
	if err != nil {
		t.Fatal(err)
	}
	relayUntil(t, skip, "A and B parked", func() bool { return skip.Stats().Parked == 2 })
	if err := env.Write(ctx, m("C", "c")); err != nil {
		t.Fatal(err)
	}
	pub.Fix()
	parked, err := op.Parked(ctx, outbox.ParkedFilter{})
	if err != nil || len(parked) != 2 {
		t.Fatalf("parked %+v, %v", parked, err)
	}
	hold, err := outbox.NewRelay(env.Store, pub, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := op.Redrive(ctx, outbox.ParkedFilter{Seqs: []int64{parked[0].Seq}}); n != 1 || err != nil {
		t.Fatalf("Redrive A = %d, %v", n, err)
	}
	relayUntil(t, hold, "A published", func() bool { return len(pub.IDs()) == 1 })
	for range 3 {
		hold.RunOnce(ctx)
	}
	if ids := pub.IDs(); !slices.Equal(ids, []string{"A"}) {
		t.Fatalf("published %v, want A alone (C held behind B)", ids)
	}
	if st := stats(t, op); st.Parked != 1 || st.HeldKeys != 1 || st.HeldRows != 1 {
		t.Fatalf("stats %+v, want C held behind B", st)
	}
	if n, err := op.Redrive(ctx, outbox.ParkedFilter{Key: "k"}); n != 1 || err != nil {
		t.Fatalf("Redrive B = %d, %v", n, err)
	}
	relayUntil(t, hold, "B and C published", func() bool { return len(pub.IDs()) == 3 })
	if ids := pub.IDs(); !slices.Equal(ids, []string{"A", "B", "C"}) {
		t.Fatalf("published %v, want A, B, C", ids)
	}
}

// gauges runs a relay on store until its gauges idemq.outbox.parked_rows
// and idemq.outbox.held_keys report, and returns them.
func gauges(t *testing.T, store outbox.Store) (parked, held int64) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	r, err := outbox.NewRelay(store, &Publisher{}, outbox.WithMeterProvider(mp), outbox.WithPollInterval(time.Hour),
		outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				g, ok := m.Data.(metricdata.Gauge[int64])
				if !ok || len(g.DataPoints) == 0 {
					continue
				}
				switch m.Name {
				case "idemq.outbox.parked_rows":
					parked, found = g.DataPoints[0].Value, found+1
				case "idemq.outbox.held_keys":
					held, found = g.DataPoints[0].Value, found+1
				}
			}
		}
		if found == 2 {
			return parked, held
		}
	}
	t.Fatal("the relay never reported the parked_rows and held_keys gauges")
	return 0, 0
}

// WaitDrained waits until s has no pending rows, failing t after timeout.
func WaitDrained(t testing.TB, s outbox.Store, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n, _, err := s.Pending(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows pending after %v", n, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchRelay measures how fast relays relays (each from newRelay) drain a
// backlog of rows rows of 200 bytes, with keys ordering keys (none when
// 0), written beforehand by write outside the timer into store's table.
// It reports msgs/s.
func BenchRelay(b *testing.B, rows, keys, relays int, store outbox.Store,
	write func(ctx context.Context, msgs ...*outbox.Message) error,
	newRelay func(opts ...outbox.Option) (*outbox.Relay, error)) {
	ctx := context.Background()
	body := make([]byte, 200)
	var total int
	var elapsed time.Duration
	for b.Loop() {
		b.StopTimer()
		for start := 0; start < rows; start += 500 {
			msgs := make([]*outbox.Message, 0, 500)
			for i := start; i < start+500; i++ {
				m := &outbox.Message{Destination: "bench", Body: body}
				if keys > 0 {
					m.Key = fmt.Sprint("k", i%keys)
				}
				msgs = append(msgs, m)
			}
			if err := write(ctx, msgs...); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		t0 := time.Now()
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for range relays {
			r, err := newRelay(outbox.WithRetention(0), outbox.WithPollInterval(10*time.Millisecond),
				outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			if err != nil {
				b.Fatal(err)
			}
			wg.Add(1)
			go func() { defer wg.Done(); r.Run(runCtx) }()
		}
		WaitDrained(b, store, 60*time.Second)
		cancel()
		wg.Wait()
		elapsed += time.Since(t0)
		total += rows
	}
	b.ReportMetric(float64(total)/elapsed.Seconds(), "msgs/s")
}

// TxWrite returns a write function that commits messages with write (an
// outbox's Write) in one transaction on db.
func TxWrite(db *sql.DB, write func(ctx context.Context, tx *sql.Tx, msgs ...*outbox.Message) error) func(ctx context.Context, msgs ...*outbox.Message) error {
	return func(ctx context.Context, msgs ...*outbox.Message) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := write(ctx, tx, msgs...); err != nil {
			return err
		}
		return tx.Commit()
	}
}
