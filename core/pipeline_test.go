package core_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/drain"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/recovery"
	"github.com/idemq/idemq/stores/sqlite"
)

// env is one broker queue and one SQLite database with an effects table
// that has no unique key: only the pipeline stands between a duplicate and
// a second effect row.
type env struct {
	t      *testing.T
	broker *memory.Broker
	store  *sqlite.Store
	queue  string
}

func newEnv(t *testing.T, brokerOpts ...memory.Option) *env {
	t.Helper()
	b, err := memory.NewBroker(brokerOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "idemq.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE effects (message_id TEXT NOT NULL, body TEXT)`); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, broker: b, store: s, queue: "q"}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// applyEffect is the business effect of the tests' handlers.
func applyEffect(ctx context.Context, tx *sql.Tx, m *core.Message) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (message_id, body) VALUES (?, ?)`, m.ID, string(m.Body))
	return err
}

func (e *env) publish(ids ...string) {
	e.t.Helper()
	msgs := make([]*core.Message, len(ids))
	for i, id := range ids {
		msgs[i] = &core.Message{ID: id, Body: []byte("body-" + id)}
	}
	e.publishMessages(msgs...)
}

// publishMessages publishes msgs as they are to the env's queue.
func (e *env) publishMessages(msgs ...*core.Message) {
	e.t.Helper()
	if err := core.NewPublisher(e.broker).Publish(context.Background(), e.queue, msgs...); err != nil {
		e.t.Fatal(err)
	}
}

func ids(n int, prefix string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return out
}

// effects returns how many effect rows each id has.
func (e *env) effects() map[string]int {
	e.t.Helper()
	rows, err := e.store.DB().Query(`SELECT message_id, count(*) FROM effects GROUP BY message_id`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			e.t.Fatal(err)
		}
		out[id] = n
	}
	return out
}

// assertExactlyOnce checks that every id in want has exactly one effect
// and nothing else has any.
func (e *env) assertExactlyOnce(want []string) {
	e.t.Helper()
	got := e.effects()
	for _, id := range want {
		if got[id] != 1 {
			e.t.Errorf("id %s applied %d times, want exactly once", id, got[id])
		}
		delete(got, id)
	}
	for id, n := range got {
		e.t.Errorf("unexpected id %s applied %d times", id, n)
	}
}

// runUntilIdle runs consumers (a new one after each simulated crash) until
// the queue has nothing ready, delayed or in flight. It fails the test after
// timeout.
func (e *env) runUntilIdle(timeout time.Duration, h core.Handler[*sql.Tx], opts ...core.Option) drain.Result {
	e.t.Helper()
	return e.drain(timeout, func(sub *memory.Subscription, opts []core.Option) (*core.Consumer[*sql.Tx], error) {
		return core.New[*sql.Tx](sub, e.store, h, opts...)
	}, opts)
}

// runBatchUntilIdle is runUntilIdle for a BatchHandler.
func (e *env) runBatchUntilIdle(timeout time.Duration, bh core.BatchHandler[*sql.Tx], opts ...core.Option) drain.Result {
	e.t.Helper()
	return e.drain(timeout, func(sub *memory.Subscription, opts []core.Option) (*core.Consumer[*sql.Tx], error) {
		return core.NewBatch[*sql.Tx](sub, e.store, bh, opts...)
	}, opts)
}

// drain runs the Consumer newConsumer builds, named "test" and quiet
// unless opts say otherwise, until the queue is drained.
func (e *env) drain(timeout time.Duration, newConsumer func(*memory.Subscription, []core.Option) (*core.Consumer[*sql.Tx], error), opts []core.Option) drain.Result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := drain.Drain(ctx, e.broker, e.queue, func(sub *memory.Subscription) (*core.Consumer[*sql.Tx], error) {
		return newConsumer(sub, append([]core.Option{core.WithName("test"), core.WithLogger(quietLogger())}, opts...))
	})
	if err != nil {
		e.t.Fatalf("draining: %v (broker stats %+v)", err, e.broker.Stats(e.queue))
	}
	return res
}

// applyAll applies the effect of each of msgs.
func applyAll(ctx context.Context, tx *sql.Tx, msgs []*core.Message) error {
	for _, m := range msgs {
		if err := applyEffect(ctx, tx, m); err != nil {
			return err
		}
	}
	return nil
}

// pipelines run the invariant tests bare and observed: the Consumer has
// one path, and an observer (of decisions and stages) must not change a
// single decision.
var pipelines = []struct {
	name string
	opts []core.Option
}{
	{"bare", nil},
	{"observed", []core.Option{core.WithObserver(&recorder{})}},
}

// recorder is an Observer and StageObserver that records what it is told.
type recorder struct {
	mu       sync.Mutex
	name     string
	log      *[]string // shared by several recorders: the call order
	starts   map[*core.Message]int
	outcomes map[*core.Message]core.Outcome
	stages   []core.Stage
	ctxKey   any // when set, StartDecision puts name under it
	current  atomic.Int64
	peak     atomic.Int64
}

func (r *recorder) StartDecision(ctx context.Context, m *core.Message) context.Context {
	n := r.current.Add(1)
	for p := r.peak.Load(); n > p && !r.peak.CompareAndSwap(p, n); p = r.peak.Load() {
	}
	r.mu.Lock()
	if r.starts == nil {
		r.starts = map[*core.Message]int{}
	}
	r.starts[m]++
	if r.log != nil {
		*r.log = append(*r.log, "start "+r.name)
	}
	r.mu.Unlock()
	if r.ctxKey != nil {
		return context.WithValue(ctx, r.ctxKey, r.name)
	}
	return ctx
}

func (r *recorder) EndDecision(ctx context.Context, m *core.Message, out core.Outcome) {
	r.mu.Lock()
	if r.outcomes == nil {
		r.outcomes = map[*core.Message]core.Outcome{}
	}
	r.outcomes[m] = out
	if r.log != nil {
		*r.log = append(*r.log, "end "+r.name)
	}
	if r.log != nil && r.ctxKey != nil && ctx.Value(r.ctxKey) != r.name {
		*r.log = append(*r.log, "end "+r.name+" got a context its start did not return")
	}
	r.mu.Unlock()
	r.current.Add(-1)
}

func (r *recorder) StartStage(ctx context.Context, s core.Stage) context.Context {
	r.mu.Lock()
	r.stages = append(r.stages, s)
	r.mu.Unlock()
	return ctx
}

func (r *recorder) EndStage(context.Context, core.Stage, error) {}

// claimSizes returns the number of messages of each claim stage seen.
func (r *recorder) claimSizes() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n []int
	for _, s := range r.stages {
		if s.Name == "claim" {
			n = append(n, len(s.Messages))
		}
	}
	return n
}

// Invariant 1 and 2: duplicates published by the broker are applied once,
// at every batch size.
func TestDuplicatePublishesAppliedOnce(t *testing.T) {
	for _, pl := range pipelines {
		for _, batch := range []int{1, 7, 100} {
			t.Run(fmt.Sprintf("%s/batch=%d", pl.name, batch), func(t *testing.T) {
				e := newEnv(t, memory.WithFaults(memory.Faults{DuplicatePublish: 0.3}), memory.WithSeed(7))
				want := ids(1500, "m")
				e.publish(want...)
				published := e.broker.Stats(e.queue).Published
				if published <= int64(len(want)) {
					t.Fatalf("fault injection made no duplicates (%d published)", published)
				}
				tot := e.runUntilIdle(time.Minute, applyEffect, append([]core.Option{core.WithBatchSize(batch)}, pl.opts...)...)
				e.assertExactlyOnce(want)
				if tot.Processed != int64(len(want)) || tot.Duplicates != published-int64(len(want)) {
					t.Errorf("processed %d duplicates %d; want %d and %d", tot.Processed, tot.Duplicates, len(want), published-int64(len(want)))
				}
			})
		}
	}
}

// Invariants 1–4 and 6 under a seeded random schedule of faults: duplicate
// publishes, lost acks (redelivery while the first copy may still be in
// flight), crashes between commit and ack, transient and panicking
// handlers, random batch sizes and concurrency. Reproduce a failure with
// IDEMQ_SEED=<printed seed>.
func TestRandomFaultSchedule(t *testing.T) {
	seeds := []uint64{1, 2, 3}
	if s := seedFromEnv(t); s != 0 {
		seeds = []uint64{s}
	} else {
		seeds = append(seeds, uint64(time.Now().UnixNano()))
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Logf("reproduce with IDEMQ_SEED=%d", seed)
			rng := rand.New(rand.NewPCG(seed, seed^0xabcdef))
			faults := memory.Faults{
				DuplicatePublish: rng.Float64() * 0.4,
				LoseAck:          rng.Float64() * 0.05,
				CrashOnAck:       rng.Float64() * 0.01,
			}
			batch := []int{1, 2, 10, 64}[rng.IntN(4)]
			concurrency := 1 + rng.IntN(3)
			isolation := core.Isolation(rng.IntN(2))
			failRate := rng.Float64() * 0.1
			panicRate := rng.Float64() * 0.02
			n := 1000 + rng.IntN(2000)
			pl := pipelines[seed%2]
			t.Logf("n=%d batch=%d concurrency=%d isolation=%d pipeline=%s faults=%+v fail=%.3f panic=%.3f", n, batch, concurrency, isolation, pl.name, faults, failRate, panicRate)

			e := newEnv(t, memory.WithSeed(seed), memory.WithVisibilityTimeout(300*time.Millisecond))
			if err := e.broker.SetFaults(memory.Faults{DuplicatePublish: faults.DuplicatePublish}); err != nil {
				t.Fatal(err)
			}
			want := ids(n, "r")
			e.publish(want...)
			if err := e.broker.SetFaults(faults); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			hrng := rand.New(rand.NewPCG(seed, 99))
			h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
				if err := applyEffect(ctx, tx, m); err != nil {
					return err
				}
				mu.Lock()
				p := hrng.Float64()
				mu.Unlock()
				switch {
				case p < panicRate:
					panic("injected panic after the effect was written")
				case p < panicRate+failRate:
					return errors.New("injected transient failure after the effect was written")
				}
				return nil
			}
			tot := e.runUntilIdle(2*time.Minute, h, append([]core.Option{
				core.WithBatchSize(batch), core.WithConcurrency(concurrency), core.WithIsolation(isolation),
				core.WithMaxAttempts(1000), core.WithBackoff(core.ConstantBackoff(time.Millisecond)),
				core.WithHandlerMiddleware(recovery.New(quietLogger()))}, pl.opts...)...)
			e.assertExactlyOnce(want)
			if dl := e.broker.DeadLetters(e.queue); len(dl) != 0 {
				t.Errorf("%d messages dead-lettered, first: %v", len(dl), dl[0].Cause)
			}
			if tot.Processed < int64(n) {
				t.Errorf("processed %d < %d unique ids", tot.Processed, n)
			}
			t.Logf("totals %+v", tot)
		})
	}
}

func seedFromEnv(t *testing.T) uint64 {
	var s uint64
	if v := strings.TrimSpace(os.Getenv("IDEMQ_SEED")); v != "" {
		if _, err := fmt.Sscan(v, &s); err != nil {
			t.Fatalf("IDEMQ_SEED=%q: %v", v, err)
		}
	}
	return s
}

// Invariant 6: consumers on one queue, with leases short enough that the
// same message is often in flight at two of them at once.
func TestConcurrentConsumersApplyOnce(t *testing.T) {
	e := newEnv(t, memory.WithVisibilityTimeout(20*time.Millisecond), memory.WithFaults(memory.Faults{DuplicatePublish: 0.2}))
	want := ids(600, "c")
	e.publish(want...)
	slow := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		time.Sleep(time.Millisecond) // long enough for leases to expire
		return applyEffect(ctx, tx, m)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var dups atomic.Int64
	for i := range 3 {
		sub, err := e.broker.Subscribe(e.queue)
		if err != nil {
			t.Fatal(err)
		}
		c, err := core.New[*sql.Tx](sub, e.store, slow, core.WithName("test"), core.WithBatchSize(1+i*5), core.WithLogger(quietLogger()))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
			dups.Add(c.Stats().Duplicates)
		}()
	}
	// Leases of 20ms keep copies coming while the machine is busy (three
	// copies of this test beside each other took 30-40s on 2 cores under
	// the race detector): the bound is sized for a loaded CI machine.
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer wcancel()
	if err := e.broker.WaitIdle(wctx, e.queue); err != nil {
		t.Fatalf("not drained: %v", err)
	}
	cancel()
	wg.Wait()
	e.assertExactlyOnce(want)
	if st := e.broker.Stats(e.queue); st.Expired == 0 {
		t.Errorf("no lease expired: the test did not exercise concurrent copies (stats %+v)", st)
	}
	if dups.Load() == 0 {
		t.Error("no duplicates were decided")
	}
}

// Invariant 3 and PEERS' Watermill trap: a message whose handler failed in a
// batch rolls back its effect AND its claim, so its redelivery is applied,
// not dropped as a duplicate; the rest of the batch commits. Under both
// isolation modes.
func TestFailingMessageInBatchRollsBackOnlyItself(t *testing.T) {
	for _, iso := range []core.Isolation{core.IsolateSavepoints, core.IsolateReplay} {
		t.Run(fmt.Sprint("isolation=", iso), func(t *testing.T) {
			e := newEnv(t)
			want := ids(20, "b")
			e.publish(want...)
			var calls sync.Map
			h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
				if err := applyEffect(ctx, tx, m); err != nil {
					return err
				}
				n, _ := calls.LoadOrStore(m.ID, new(atomic.Int32))
				if (m.ID == "b-00007" || m.ID == "b-00013") && n.(*atomic.Int32).Add(1) == 1 {
					return errors.New("transient failure after writing the effect")
				}
				return nil
			}
			sizes := &recorder{}
			tot := e.runUntilIdle(30*time.Second, h, core.WithBatchSize(20), core.WithLinger(200*time.Millisecond),
				core.WithBackoff(core.ConstantBackoff(time.Millisecond)), core.WithObserver(sizes), core.WithIsolation(iso))
			e.assertExactlyOnce(want)
			if tot.Retried != 2 || tot.Processed != 20 || tot.Duplicates != 0 {
				t.Errorf("stats %+v, want 2 retries, 20 processed, 0 duplicates", tot.Stats)
			}
			batchSizes := sizes.claimSizes()
			if len(batchSizes) == 0 || batchSizes[0] != 20 {
				t.Errorf("first claim covered %v messages, want one batch of 20", batchSizes)
			}
			if iso == core.IsolateReplay && (len(batchSizes) < 3 || batchSizes[1] != 19 || batchSizes[2] != 18) {
				t.Errorf("replay claims %v, want 20, then 19 and 18 without the failed ones", batchSizes)
			}
		})
	}
}

// A BatchHandler gets every claim won in one call; duplicates never reach
// it; when it fails, each message is decided alone so only the poison one
// is dead-lettered.
func TestBatchHandler(t *testing.T) {
	e := newEnv(t)
	want := ids(30, "s")
	e.publish(want...)
	e.publish(want[:5]...) // duplicates
	e.publish("poison")
	var mu sync.Mutex
	var calls [][]string
	bh := func(ctx context.Context, tx *sql.Tx, msgs []*core.Message) error {
		var batch []string
		for _, m := range msgs {
			batch = append(batch, m.ID)
		}
		mu.Lock()
		calls = append(calls, batch)
		mu.Unlock()
		for _, m := range msgs {
			if m.ID == "poison" {
				return core.Permanent(errors.New("poison in the batch"))
			}
			if err := applyEffect(ctx, tx, m); err != nil {
				return err
			}
		}
		return nil
	}
	res := e.runBatchUntilIdle(30*time.Second, bh, core.WithBatchSize(50), core.WithLinger(100*time.Millisecond))
	e.assertExactlyOnce(want)
	if res.Processed != 30 || res.Duplicates != 5 || res.DeadLettered != 1 {
		t.Errorf("stats %+v", res.Stats)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) == 0 || len(calls[0]) != 31 {
		t.Fatalf("first call had %d messages, want the 31 distinct ids", len(calls[0]))
	}
	for _, c := range calls[1:] {
		if len(c) != 1 {
			t.Errorf("after the failure, calls with %d messages, want one each", len(c))
		}
	}
	if dl := e.broker.DeadLetters(e.queue); len(dl) != 1 || dl[0].Message.ID != "poison" {
		t.Errorf("dead letters %+v", dl)
	}
}

// A permanent failure dead-letters with its cause and releases the claim:
// a redrive from the dead-letter queue applies the message.
func TestPermanentFailureDeadLettersAndRedriveApplies(t *testing.T) {
	e := newEnv(t)
	want := ids(10, "p")
	e.publish(want...)
	var poison atomic.Bool
	poison.Store(true)
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if err := applyEffect(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "p-00003" && poison.Load() {
			return core.Permanent(errors.New("account closed"))
		}
		return nil
	}
	tot := e.runUntilIdle(30*time.Second, h, core.WithBatchSize(10))
	dl := e.broker.DeadLetters(e.queue)
	if len(dl) != 1 || dl[0].Message.ID != "p-00003" || !strings.Contains(fmt.Sprint(dl[0].Cause), "account closed") || !core.IsPermanent(dl[0].Cause) {
		t.Fatalf("dead letters %+v, want p-00003 with its cause", dl)
	}
	if tot.DeadLettered != 1 {
		t.Errorf("DeadLettered = %d", tot.DeadLettered)
	}
	if got := e.effects()["p-00003"]; got != 0 {
		t.Fatalf("dead-lettered message has %d effects", got)
	}
	poison.Store(false)
	if n := e.broker.Redrive(e.queue); n != 1 {
		t.Fatalf("redrove %d", n)
	}
	tot = e.runUntilIdle(30*time.Second, h)
	if tot.Processed != 1 {
		t.Errorf("redriven message: %+v, want processed", tot.Stats)
	}
	e.assertExactlyOnce(want)
}

// Transient failures that persist are dead-lettered after MaxAttempts.
func TestMaxAttemptsDeadLetters(t *testing.T) {
	e := newEnv(t)
	e.publish("stuck")
	var calls atomic.Int32
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		calls.Add(1)
		return errors.New("always down")
	}
	e.runUntilIdle(30*time.Second, h, core.WithMaxAttempts(3), core.WithBackoff(core.ConstantBackoff(time.Millisecond)))
	dl := e.broker.DeadLetters(e.queue)
	if len(dl) != 1 || !errors.Is(dl[0].Cause, core.ErrMaxAttempts) {
		t.Fatalf("dead letters %+v, want one with ErrMaxAttempts", dl)
	}
	if calls.Load() != 3 {
		t.Errorf("handler ran %d times, want 3", calls.Load())
	}
}

// Invariant 5 and "bad input loses nothing": missing, empty, oversized and
// malformed ids are dead-lettered with the reason, never processed.
func TestBadIDsDeadLetteredWithReason(t *testing.T) {
	t.Run("middleware", func(t *testing.T) { testBadIDs(t, true) })
	t.Run("direct", func(t *testing.T) { testBadIDs(t, false) })
}

// testBadIDs publishes messages with bad ids and one good one; with
// watch, an observer also checks the outcome it sees.
func testBadIDs(t *testing.T, watch bool) {
	e := newEnv(t)
	long := strings.Repeat("x", 256)
	bad := []*core.Message{
		{ID: "", Body: []byte("no id")},
		{ID: long, Body: []byte("long")},
		{ID: "nul\x00byte", Body: []byte("nul")},
		{ID: string([]byte{0xff, 0xfe, 'a'}), Body: []byte("utf8")},
	}
	if err := core.NewPublisher(e.broker).Publish(context.Background(), e.queue, bad...); err != nil {
		t.Fatal(err)
	}
	e.publish("good")
	seen := &recorder{}
	var handled atomic.Int32
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		handled.Add(1)
		return applyEffect(ctx, tx, m)
	}
	opts := []core.Option{core.WithBatchSize(5), core.WithLinger(50 * time.Millisecond)}
	if watch {
		opts = append(opts, core.WithObserver(seen))
	}
	e.runUntilIdle(30*time.Second, h, opts...)
	if handled.Load() != 1 {
		t.Errorf("handler ran %d times, want only for the good id", handled.Load())
	}
	dl := e.broker.DeadLetters(e.queue)
	if len(dl) != len(bad) {
		t.Fatalf("%d dead letters, want %d", len(dl), len(bad))
	}
	wantErr := map[string]error{"no id": core.ErrMissingID, "long": core.ErrInvalidID, "nul": core.ErrInvalidID, "utf8": core.ErrInvalidID}
	for _, d := range dl {
		if w := wantErr[string(d.Message.Body)]; !errors.Is(d.Cause, w) {
			t.Errorf("body %q dead-lettered with %v, want %v", d.Message.Body, d.Cause, w)
		}
		if !watch {
			continue
		}
		var out core.Outcome
		seen.mu.Lock()
		for m, o := range seen.outcomes {
			if string(m.Body) == string(d.Message.Body) {
				out = o
			}
		}
		seen.mu.Unlock()
		if out.Decision != core.DeadLetter {
			t.Errorf("observer saw %v for %q, want dead_letter", out.Decision, d.Message.Body)
		}
	}
	e.assertExactlyOnce([]string{"good"})
}

// An IDFunc derives the id; its error dead-letters with the cause.
func TestIDFunc(t *testing.T) {
	e := newEnv(t)
	msgs := []*core.Message{
		{Headers: map[string]string{"biz-id": "order-1"}, Body: []byte("a")},
		{Headers: map[string]string{"biz-id": "order-1"}, Body: []byte("a")},
		{Body: []byte("headerless")},
	}
	if err := core.NewPublisher(e.broker).Publish(context.Background(), e.queue, msgs...); err != nil {
		t.Fatal(err)
	}
	idf := func(m *core.Message) (string, error) {
		if id, ok := m.Headers["biz-id"]; ok {
			return id, nil
		}
		return "", errors.New("no biz-id header")
	}
	tot := e.runUntilIdle(30*time.Second, applyEffect, core.WithIDFunc(idf))
	e.assertExactlyOnce([]string{"order-1"})
	if tot.Duplicates != 1 || tot.DeadLettered != 1 {
		t.Errorf("stats %+v, want 1 duplicate and 1 dead letter", tot.Stats)
	}
	dl := e.broker.DeadLetters(e.queue)
	if len(dl) != 1 || !strings.Contains(dl[0].Cause.Error(), "no biz-id header") || !errors.Is(dl[0].Cause, core.ErrMissingID) {
		t.Errorf("dead letters %+v", dl)
	}
}

// The same id with a different body is caught by its fingerprint and
// dead-lettered (default) or treated as a duplicate (by option).
func TestFingerprintMismatch(t *testing.T) {
	for _, policy := range []core.Decision{core.DeadLetter, core.Duplicate} {
		t.Run(fmt.Sprint(policy), func(t *testing.T) {
			e := newEnv(t)
			e.publish("same")
			e.runUntilIdle(30*time.Second, applyEffect, core.WithMismatchDecision(policy))
			// Once in a later delivery, once twice within one batch.
			if err := core.NewPublisher(e.broker).Publish(context.Background(), e.queue,
				&core.Message{ID: "same", Body: []byte("other body")},
				&core.Message{ID: "x", Body: []byte("1")}, &core.Message{ID: "x", Body: []byte("2")}); err != nil {
				t.Fatal(err)
			}
			tot := e.runUntilIdle(30*time.Second, applyEffect, core.WithMismatchDecision(policy), core.WithBatchSize(3), core.WithLinger(100*time.Millisecond))
			e.assertExactlyOnce([]string{"same", "x"})
			dl := e.broker.DeadLetters(e.queue)
			if policy == core.DeadLetter {
				if len(dl) != 2 || !errors.Is(dl[0].Cause, core.ErrFingerprintMismatch) || !errors.Is(dl[1].Cause, core.ErrFingerprintMismatch) {
					t.Fatalf("dead letters %+v, want two fingerprint mismatches", dl)
				}
			} else if len(dl) != 0 || tot.Duplicates != 2 {
				t.Fatalf("dead letters %d, duplicates %d; want 0 and 2", len(dl), tot.Duplicates)
			}
		})
	}
}

// WithFingerprint decides what counts as the same body: a custom function
// lets bodies it maps to one fingerprint pass as duplicates and catches the
// others; nil turns the check off, so a reused id is a Duplicate whatever
// its body.
func TestFingerprintOption(t *testing.T) {
	t.Run("custom", func(t *testing.T) {
		e := newEnv(t)
		caseless := core.WithFingerprint(func(b []byte) string { return core.Fingerprint(bytes.ToLower(b)) })
		e.publishMessages(&core.Message{ID: "a", Body: []byte("Hello")})
		e.runUntilIdle(30*time.Second, applyEffect, caseless)
		e.publishMessages(&core.Message{ID: "a", Body: []byte("HELLO")}, &core.Message{ID: "a", Body: []byte("world")})
		tot := e.runUntilIdle(30*time.Second, applyEffect, caseless)
		e.assertExactlyOnce([]string{"a"})
		dl := e.broker.DeadLetters(e.queue)
		if tot.Duplicates != 1 || len(dl) != 1 || !errors.Is(dl[0].Cause, core.ErrFingerprintMismatch) || string(dl[0].Message.Body) != "world" {
			t.Fatalf("duplicates %d, dead letters %+v; want HELLO a duplicate and world a fingerprint mismatch", tot.Duplicates, dl)
		}
	})
	t.Run("off", func(t *testing.T) {
		e := newEnv(t)
		off := core.WithFingerprint(nil)
		e.publishMessages(&core.Message{ID: "a", Body: []byte("one body")})
		e.runUntilIdle(30*time.Second, applyEffect, off)
		e.publishMessages(&core.Message{ID: "a", Body: []byte("another body")})
		tot := e.runUntilIdle(30*time.Second, applyEffect, off)
		e.assertExactlyOnce([]string{"a"})
		if dl := e.broker.DeadLetters(e.queue); tot.Duplicates != 1 || len(dl) != 0 {
			t.Fatalf("duplicates %d, dead letters %+v; want the reused id a duplicate", tot.Duplicates, dl)
		}
	})
}

// A panicking handler is rolled back and retried with the recovery
// middleware; the consumer survives.
func TestPanickingHandlerIsRetried(t *testing.T) {
	e := newEnv(t)
	e.publish("boom", "calm")
	var panicked atomic.Bool
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if err := applyEffect(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "boom" && panicked.CompareAndSwap(false, true) {
			panic("nil map somewhere")
		}
		return nil
	}
	tot := e.runUntilIdle(30*time.Second, h, core.WithHandlerMiddleware(recovery.New(quietLogger())),
		core.WithBatchSize(2), core.WithLinger(50*time.Millisecond), core.WithBackoff(core.ConstantBackoff(time.Millisecond)))
	e.assertExactlyOnce([]string{"boom", "calm"})
	if tot.Retried != 1 {
		t.Errorf("retried %d, want 1", tot.Retried)
	}
}

// Observers see every decision, Duplicate and DeadLetter included, start
// in the order given and end in the reverse order, each end getting its
// own start's context; the context the last start returned reaches the
// handler.
func TestObserversSeeEveryDecision(t *testing.T) {
	e := newEnv(t)
	e.publish("a", "a", "b")
	if err := core.NewPublisher(e.broker).Publish(context.Background(), e.queue, &core.Message{Body: []byte("no id")}); err != nil {
		t.Fatal(err)
	}
	type outerKey struct{}
	type innerKey struct{}
	var log []string
	outer := &recorder{name: "outer", log: &log, ctxKey: outerKey{}}
	inner := &recorder{name: "inner", log: &log, ctxKey: innerKey{}}
	var ctxOK atomic.Int32
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if ctx.Value(outerKey{}) == "outer" && ctx.Value(innerKey{}) == "inner" {
			ctxOK.Add(1)
		}
		return applyEffect(ctx, tx, m)
	}
	// Both recorders append to one log under their own locks: run with
	// one message in flight so the log's order is the calls' order.
	e.runUntilIdle(30*time.Second, h, core.WithObserver(outer, inner), core.WithWindow(1))
	decisions := map[core.Decision]int{}
	for _, out := range outer.outcomes {
		decisions[out.Decision]++
	}
	if decisions[core.Processed] != 2 || decisions[core.Duplicate] != 1 || decisions[core.DeadLetter] != 1 {
		t.Errorf("decisions seen %v", decisions)
	}
	if len(outer.starts) != 4 || len(inner.outcomes) != 4 {
		t.Errorf("observers saw %d and %d messages, want 4", len(outer.starts), len(inner.outcomes))
	}
	want := strings.Repeat("start outer,start inner,end inner,end outer,", 4)
	if got := strings.Join(log, ",") + ","; got != want {
		t.Errorf("observer calls %s\nwant %s", got, want)
	}
	if ctxOK.Load() != 2 {
		t.Errorf("the observers' context reached the handler %d times, want 2", ctxOK.Load())
	}
}

// Every store stage of a batch is observed with the batch's messages and
// their decision contexts; a BatchHandler runs under the context its
// stage's start returned.
func TestStagesAreObserved(t *testing.T) {
	e := newEnv(t)
	want := ids(10, "st")
	e.publish(want...)
	type key struct{}
	obs := &stageCtx{recorder: &recorder{name: "obs", ctxKey: key{}}}
	var sawStageCtx atomic.Int32
	bh := func(ctx context.Context, tx *sql.Tx, msgs []*core.Message) error {
		if ctx.Value(stageKey{}) == core.StageHandlers {
			sawStageCtx.Add(1)
		}
		return applyAll(ctx, tx, msgs)
	}
	e.runBatchUntilIdle(30*time.Second, bh, core.WithBatchSize(10), core.WithLinger(200*time.Millisecond), core.WithObserver(obs))
	e.assertExactlyOnce(want)
	var names []string
	for _, s := range obs.stages {
		names = append(names, string(s.Name))
		if len(s.Messages) != 10 || len(s.Contexts) != 10 {
			t.Errorf("stage %s: %d messages, %d contexts, want 10", s.Name, len(s.Messages), len(s.Contexts))
			continue
		}
		for i, c := range s.Contexts {
			if c.Value(key{}) != "obs" {
				t.Errorf("stage %s: context %d is not the message's decision context", s.Name, i)
			}
		}
	}
	if got := strings.Join(names, ","); got != "begin,claim,handlers,commit" {
		t.Errorf("stages %s, want begin,claim,handlers,commit", got)
	}
	if sawStageCtx.Load() != 1 {
		t.Errorf("the handlers stage's context reached the BatchHandler %d times, want 1", sawStageCtx.Load())
	}
}

type stageKey struct{}

// stageCtx is a recorder whose StartStage marks the context with the
// stage's name.
type stageCtx struct{ *recorder }

func (s *stageCtx) StartStage(ctx context.Context, st core.Stage) context.Context {
	s.recorder.StartStage(ctx, st)
	return context.WithValue(ctx, stageKey{}, st.Name)
}

// Handler middleware wraps a BatchHandler too: recovery turns its panic
// into a retry, and the batch is then decided message by message.
func TestBatchHandlerPanicIsRecovered(t *testing.T) {
	e := newEnv(t)
	want := ids(8, "bp")
	e.publish(want...)
	var panicked atomic.Bool
	bh := func(ctx context.Context, tx *sql.Tx, msgs []*core.Message) error {
		if err := applyAll(ctx, tx, msgs); err != nil {
			return err
		}
		if len(msgs) > 1 && panicked.CompareAndSwap(false, true) {
			panic("index out of range somewhere")
		}
		return nil
	}
	res := e.runBatchUntilIdle(30*time.Second, bh, core.WithBatchSize(8), core.WithLinger(200*time.Millisecond),
		core.WithHandlerMiddleware(recovery.New(quietLogger())))
	e.assertExactlyOnce(want)
	if !panicked.Load() || res.Processed != 8 || res.DeadLettered != 0 {
		t.Errorf("panicked %v, stats %+v; want a recovered panic and 8 processed", panicked.Load(), res.Stats)
	}
}

// Invariant 7: however deep the queue, messages held at once stay within
// the window.
func TestInFlightBoundedByWindow(t *testing.T) {
	e := newEnv(t)
	want := ids(5000, "w")
	e.publish(want...)
	obs := &recorder{}
	e.runUntilIdle(time.Minute, applyEffect, core.WithObserver(obs), core.WithBatchSize(10), core.WithConcurrency(2), core.WithWindow(25))
	e.assertExactlyOnce(want)
	if p := obs.peak.Load(); p > 25 || p < 10 {
		t.Errorf("peak in flight %d, want between the batch size 10 and the window 25", p)
	}
}

// Workers that share a queue fill their batches one at a time: with a
// linger longer than the test, 30 messages make three full batches of 10
// among four free workers, where workers taking from the queue together
// would each hold part of a batch.
func TestWorkersFillOneAtATime(t *testing.T) {
	e := newEnv(t)
	want := ids(30, "w")
	e.publish(want...)
	var mu sync.Mutex
	var sizes []int
	bh := func(ctx context.Context, tx *sql.Tx, msgs []*core.Message) error {
		mu.Lock()
		sizes = append(sizes, len(msgs))
		mu.Unlock()
		return applyAll(ctx, tx, msgs)
	}
	res := e.runBatchUntilIdle(30*time.Second, bh, core.WithConcurrency(4), core.WithBatchSize(10), core.WithLinger(time.Minute))
	e.assertExactlyOnce(want)
	mu.Lock()
	defer mu.Unlock()
	if res.Processed != 30 || !slices.Equal(sizes, []int{10, 10, 10}) {
		t.Errorf("processed %d in batches of %v, want 30 in three batches of 10", res.Processed, sizes)
	}
}
