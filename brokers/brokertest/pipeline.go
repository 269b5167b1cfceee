package brokertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/sqlite"
)

// The pipeline cases run core.Consumer over the adapter with the SQLite
// store. The handler's effect is a row in an effects table with no unique
// key, so an effect applied twice is counted twice.

// Effects counts committed effects: a SQLite dedup store plus a business
// table with no unique key, so an effect applied twice counts twice. The
// suite's cases use it, and adapters' own tests may too.
type Effects struct {
	store *sqlite.Store
}

// NewEffects opens an Effects in the test's temporary directory, closed
// when the test ends.
func NewEffects(t *testing.T) *Effects {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "brokertest.db"))
	if err != nil {
		t.Fatalf("sqlite store: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE effects (id TEXT NOT NULL, body TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &Effects{store: st}
}

// Store is the dedup store.
func (e *Effects) Store() *sqlite.Store { return e.store }

// Apply is the business effect, in the claim's transaction: a row for m.
func (e *Effects) Apply(ctx context.Context, tx *sql.Tx, m *core.Message) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (id, body) VALUES (?, ?)`, m.ID, string(m.Body))
	return err
}

// Counts returns how many times each id's effect was committed.
func (e *Effects) Counts(t *testing.T) map[string]int {
	t.Helper()
	rows, err := e.store.DB().Query(`SELECT id, count(*) FROM effects GROUP BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// WantOnce checks that the effect of each of msgs was committed exactly
// once, and returns the counts of every id.
func (e *Effects) WantOnce(t *testing.T, msgs []*driver.Message) map[string]int {
	t.Helper()
	counts := e.Counts(t)
	for _, m := range msgs {
		if counts[m.ID] != 1 {
			t.Errorf("%s applied %d times, want exactly 1", m.ID, counts[m.ID])
		}
	}
	return counts
}

// Run runs a Consumer of src with h and opts over e's store in the
// background until the test ends; stop cancels it and returns Run's error.
func (e *Effects) Run(t *testing.T, src driver.Source, h core.Handler[*sql.Tx], opts ...core.Option) (c *core.Consumer[*sql.Tx], stop func() error) {
	t.Helper()
	c, err := core.New(src, e.store, h, opts...)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	r := start(t, c)
	return c, func() error { return r.shutdown(t) }
}

// running is a Consumer running in the background.
type running struct {
	c    *core.Consumer[*sql.Tx]
	stop context.CancelFunc
	done chan error
}

func runConsumer(t *testing.T, src driver.Source, e *Effects, h core.Handler[*sql.Tx], opts ...core.Option) *running {
	t.Helper()
	c, err := core.New[*sql.Tx](src, e.store, h, pipelineOptions(opts)...)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	return start(t, c)
}

// pipelineOptions are the suite's Consumer options, then opts.
func pipelineOptions(opts []core.Option) []core.Option {
	return append([]core.Option{
		core.WithName("brokertest"),
		core.WithBackoff(core.ConstantBackoff(50 * time.Millisecond)),
		core.WithShutdownTimeout(5 * time.Second),
	}, opts...)
}

// start runs c in the background until the test ends.
func start(t *testing.T, c *core.Consumer[*sql.Tx]) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.shutdown(t) })
	return r
}

// shutdown cancels the consumer and waits for Run; it returns Run's error.
func (r *running) shutdown(t *testing.T) error {
	r.stop()
	select {
	case err := <-r.done:
		r.done <- err // later calls see it too
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Consumer.Run did not return within 30s of cancellation")
		return nil
	}
}

// published opens a fixture and an Effects and publishes copies of n new
// messages (see messages) to the fixture: all n, then all n again, copies
// times in all.
func (h Harness) published(t *testing.T, prefix string, n, copies int) (*Fixture, *Effects, []*driver.Message) {
	t.Helper()
	f := h.fixture(t)
	e := NewEffects(t)
	msgs := messages(prefix, n)
	var all []*driver.Message
	for range copies {
		all = append(all, msgs...)
	}
	publish(t, h, f, all...)
	return f, e, msgs
}

// finish stops the consumer and fails if Run returned an error.
func (r *running) finish(t *testing.T) {
	t.Helper()
	if err := r.shutdown(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// finishWhen waits until cond holds of the consumer's stats, stops it as finish
// does, and returns its stats.
func (r *running) finishWhen(t *testing.T, timeout time.Duration, what string, cond func(core.Stats) bool) core.Stats {
	t.Helper()
	waitFor(t, timeout, what, func() bool { return cond(r.c.Stats()) })
	r.finish(t)
	return r.c.Stats()
}

// decideAll waits until the consumers decided total deliveries between
// them, stops them, and returns their Processed and Duplicates summed.
func decideAll(t *testing.T, timeout time.Duration, total int64, rs ...*running) (processed, duplicates int64) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("%d deliveries decided", total), func() bool {
		var n int64
		for _, r := range rs {
			st := r.c.Stats()
			n += st.Processed + st.Duplicates
		}
		return n >= total
	})
	for _, r := range rs {
		r.finish(t)
		st := r.c.Stats()
		t.Logf("consumer stats: %+v", st)
		processed += st.Processed
		duplicates += st.Duplicates
	}
	return processed, duplicates
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func testPipelineMissingID(t *testing.T, h Harness) {
	f := h.fixture(t)
	e := NewEffects(t)
	msgs := messages("noid", 2)
	noID := &driver.Message{Body: []byte("no-id-" + randomHex(4))}
	publish(t, h, f, msgs[0], noID, msgs[1])
	var handled sync.Map
	r := runConsumer(t, source(t, f), e, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		handled.Store(string(m.Body), true)
		return e.Apply(ctx, tx, m)
	})
	r.finishWhen(t, h.ReceiveTimeout, "2 processed and 1 dead-lettered", func(st core.Stats) bool {
		return st.Processed == 2 && st.DeadLettered == 1
	})
	if _, ok := handled.Load(string(noID.Body)); ok {
		t.Error("the handler ran for a message without an id")
	}
	got := waitDeadLetters(t, h, f, "")
	dl := got[""]
	if string(dl.Body) != string(noID.Body) {
		t.Errorf("parked body %q, want %q", dl.Body, noID.Body)
	}
	if h.RecordsCause && !strings.Contains(dl.Cause, core.ErrMissingID.Error()) {
		t.Errorf("parked cause %q does not name %q", dl.Cause, core.ErrMissingID)
	}
	counts := e.WantOnce(t, msgs)
	if len(counts) != len(msgs) {
		t.Errorf("effects for %d ids, want %d: %v", len(counts), len(msgs), counts)
	}
}

func testPipelineDuplicates(t *testing.T, h Harness) {
	const unique, copies = 20, 3
	// Every id published three times, the copies spread through the queue.
	f, e, msgs := h.published(t, "dup", unique, copies)
	// Two consumers on one store, one batching, one not: the copies of an
	// id race each other across consumers and inside a batch's claim.
	h1 := func(ctx context.Context, tx *sql.Tx, m *core.Message) error { return e.Apply(ctx, tx, m) }
	r1 := runConsumer(t, source(t, f), e, h1, core.WithBatchSize(5), core.WithWindow(10), core.WithLinger(5*time.Millisecond))
	r2 := runConsumer(t, source(t, f), e, h1, core.WithConcurrency(2), core.WithWindow(4))
	total := int64(unique * copies)
	p, d := decideAll(t, 2*h.ReceiveTimeout, total, r1, r2)
	if p != unique {
		t.Errorf("Processed = %d, want %d", p, unique)
	}
	if d != total-unique {
		t.Errorf("Duplicates = %d, want %d", d, total-unique)
	}
	e.WantOnce(t, msgs)
	expectQuiet(t, h, receiver(t, f, 0))
}

// failsFirstTry says whether flakyHandler fails the first try of id:
// every other id of messages.
func failsFirstTry(id string) bool { return (id[len(id)-1]-'0')%2 == 0 }

// flakyHandler applies e's effect, then fails the first try of every other
// message (failsFirstTry): the effect and the claim must roll back
// together, and the redelivery must not be taken for a duplicate.
func flakyHandler(e *Effects) core.Handler[*sql.Tx] {
	var mu sync.Mutex
	calls := map[string]int{}
	return func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if err := e.Apply(ctx, tx, m); err != nil {
			return err
		}
		mu.Lock()
		calls[m.ID]++
		n := calls[m.ID]
		mu.Unlock()
		if n == 1 && failsFirstTry(m.ID) {
			return errors.New("transient failure")
		}
		return nil
	}
}

// poisonHandler applies e's effect, then fails every try of poison,
// counting them in calls.
func poisonHandler(e *Effects, poison string, calls *atomic.Int64) core.Handler[*sql.Tx] {
	return func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if err := e.Apply(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == poison {
			calls.Add(1)
			return errors.New("still failing")
		}
		return nil
	}
}

func testPipelineRetry(t *testing.T, h Harness) {
	f, e, msgs := h.published(t, "flaky", 10, 1)
	r := runConsumer(t, source(t, f), e, flakyHandler(e), core.WithBatchSize(4), core.WithWindow(8))
	st := r.finishWhen(t, h.ReceiveTimeout, "10 processed", func(st core.Stats) bool { return st.Processed == 10 })
	if st.Retried != 5 || st.Duplicates != 0 || st.DeadLettered != 0 {
		t.Errorf("stats %+v: want 5 retried, no duplicates, none dead-lettered", st)
	}
	e.WantOnce(t, msgs)
	expectQuiet(t, h, receiver(t, f, 0))
}

// crashingSource wraps a source so that the Ack call that would settle
// its crashAt-th message closes the source instead of acknowledging: the
// consumer committed, then died before the ack reached the broker.
type crashingSource struct {
	driver.Puller
	crashAt int64
	acks    atomic.Int64
	acked   atomic.Int64
	// mu keeps the crash from closing the source under an Ack in flight,
	// which the broker may or may not have taken (an RPC cancelled by the
	// close): every ack is then known taken or never sent, so the test
	// knows how many messages must come back.
	mu sync.Mutex
}

// Ack acknowledges ms, unless they hold the crashAt-th message: then it
// closes the source and acknowledges none.
func (c *crashingSource) Ack(ctx context.Context, ms []*driver.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := int64(len(ms))
	if after := c.acks.Add(n); after >= c.crashAt && after-n < c.crashAt {
		_ = c.Puller.Close()
		return errors.New("brokertest: crashed between commit and ack")
	}
	err := c.Puller.Ack(ctx, ms)
	if err == nil {
		c.acked.Add(n)
	}
	return err
}

// pullSource opens a source that must be a Puller.
func pullSource(t *testing.T, f *Fixture) driver.Puller {
	t.Helper()
	p, ok := source(t, f).(driver.Puller)
	if !ok {
		t.Fatal("brokertest: Run is for pull sources; a push source runs RunPush")
	}
	return p
}

func testPipelineCrash(t *testing.T, h Harness) {
	const n = 12
	f, e, msgs := h.published(t, "crash", n, 1)
	handler := func(ctx context.Context, tx *sql.Tx, m *core.Message) error { return e.Apply(ctx, tx, m) }
	crash := &crashingSource{Puller: pullSource(t, f), crashAt: 4}
	r1 := runConsumer(t, crash, e, handler, core.WithWindow(3))
	select {
	case err := <-r1.done:
		r1.done <- err
		if !errors.Is(err, driver.ErrSourceClosed) {
			t.Fatalf("Run after the crash = %v, want an error wrapping driver.ErrSourceClosed", err)
		}
	case <-time.After(h.ReceiveTimeout):
		t.Fatal("the consumer did not stop after its source crashed")
	}
	acked := crash.acked.Load()
	if acked >= n {
		t.Fatalf("all %d acked before the crash", acked)
	}
	// A new process takes over: what the first committed but did not ack
	// comes back and must be a Duplicate.
	r2 := runConsumer(t, source(t, f), e, handler, core.WithWindow(3))
	left := n - acked
	st := r2.finishWhen(t, h.ReceiveTimeout, fmt.Sprintf("%d redelivered messages decided", left), func(st core.Stats) bool {
		return st.Processed+st.Duplicates >= left
	})
	if st.Duplicates < 1 {
		t.Errorf("second consumer stats %+v: the message committed before the crash must be a Duplicate", st)
	}
	e.WantOnce(t, msgs)
	expectQuiet(t, h, receiver(t, f, 0))
}

func testPipelineShutdown(t *testing.T, h Harness) {
	const n = 40
	f, e, msgs := h.published(t, "shutdown", n, 1)
	slow := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		time.Sleep(10 * time.Millisecond)
		return e.Apply(ctx, tx, m)
	}
	r1 := runConsumer(t, source(t, f), e, slow, core.WithBatchSize(4), core.WithWindow(8))
	waitFor(t, h.ReceiveTimeout, "10 processed", func() bool { return r1.c.Stats().Processed >= 10 })
	// Cancel mid-stream: in-flight batches finish, everything decided is
	// settled, the source closes, Run returns nil.
	if err := r1.shutdown(t); err != nil {
		t.Fatalf("Run after cancellation = %v, want nil", err)
	}
	st1 := r1.c.Stats()
	if st1.Processed >= n {
		t.Fatalf("all %d processed before the shutdown took effect", st1.Processed)
	}
	// The next consumer gets exactly what was not acked. Had the first
	// one's Close dropped acks of committed messages, they would come back
	// here as Duplicates.
	r2 := runConsumer(t, source(t, f), e, slow, core.WithBatchSize(4), core.WithWindow(8))
	left := n - st1.Processed
	st2 := r2.finishWhen(t, h.ReceiveTimeout, fmt.Sprintf("%d remaining processed", left), func(st core.Stats) bool {
		return st.Processed+st.Duplicates >= left
	})
	t.Logf("first consumer %+v; second %+v", st1, st2)
	if st2.Duplicates != 0 || st2.Processed != left {
		t.Errorf("second consumer processed %d and saw %d duplicates, want %d and 0: the graceful shutdown left decided messages unsettled", st2.Processed, st2.Duplicates, left)
	}
	e.WantOnce(t, msgs)
	expectQuiet(t, h, receiver(t, f, 0))
}

// A message whose handler always fails transiently must reach MaxAttempts
// through the adapter's Attempt and be dead-lettered, not retried forever
// (a broker that only flags redeliveries needs the adapter to count).
func testPipelinePoison(t *testing.T, h Harness) {
	f, e, msgs := h.published(t, "poison", 2, 1)
	poison := msgs[0].ID
	var calls atomic.Int64
	r := runConsumer(t, source(t, f), e, poisonHandler(e, poison, &calls), core.WithMaxAttempts(3))
	r.finishWhen(t, h.ReceiveTimeout, "the poison message dead-lettered", func(st core.Stats) bool {
		return st.DeadLettered == 1 && st.Processed == 1
	})
	if n := calls.Load(); n != 3 {
		t.Errorf("handler ran %d times for the poison message, want MaxAttempts = 3", n)
	}
	dl := waitDeadLetters(t, h, f, poison)[poison]
	if h.RecordsCause && !strings.Contains(dl.Cause, core.ErrMaxAttempts.Error()) {
		t.Errorf("parked cause %q does not name %q", dl.Cause, core.ErrMaxAttempts)
	}
	counts := e.Counts(t)
	if counts[poison] != 0 || counts[msgs[1].ID] != 1 {
		t.Errorf("effects %v: want none for the poison message and one for the other", counts)
	}
	expectQuiet(t, h, receiver(t, f, 0))
}
