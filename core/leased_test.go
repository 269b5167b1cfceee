package core_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/drain"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/effects"
	"github.com/idemq/idemq/effects/effectstest"
	"github.com/idemq/idemq/stores/sqlite"
)

// fastBackoff keeps the retries of the lease tests short.
var fastBackoff = core.WithBackoff(core.ExponentialBackoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2})

// completeEffect is the leased tests' local effect: the effects row, with
// the external result as its body.
func completeEffect(ctx context.Context, tx *sql.Tx, m *core.Message, result string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (message_id, body) VALUES (?, ?)`, m.ID, result)
	return err
}

// calls counts External calls per message id.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *calls) of(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// outcomes records each message's decisions, in order.
type outcomes struct {
	mu  sync.Mutex
	all map[string][]core.Outcome
	hit func(m *core.Message, out core.Outcome)
}

func (o *outcomes) observer() core.Observer {
	return core.DecisionFunc(func(_ context.Context, m *core.Message, out core.Outcome) {
		o.mu.Lock()
		if o.all == nil {
			o.all = map[string][]core.Outcome{}
		}
		o.all[m.ID] = append(o.all[m.ID], out)
		hit := o.hit
		o.mu.Unlock()
		if hit != nil {
			hit(m, out)
		}
	})
}

func (o *outcomes) of(id string) []core.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]core.Outcome(nil), o.all[id]...)
}

func (e *env) drainLeased(h core.LeasedHandler[*sql.Tx, string], opts ...core.Option) drain.Result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := drain.Drain(ctx, e.broker, e.queue, func(sub *memory.Subscription) (*core.Consumer[*sql.Tx], error) {
		return core.NewLeased(sub, e.store, h, append([]core.Option{core.WithName("test"), core.WithLogger(quietLogger()), fastBackoff}, opts...)...)
	})
	if err != nil {
		e.t.Fatalf("draining: %v (broker stats %+v)", err, e.broker.Stats(e.queue))
	}
	return res
}

// startLeased runs a leased consumer on a subscription of its own until
// the stop it returns is called (or the test ends).
func (e *env) startLeased(h core.LeasedHandler[*sql.Tx, string], opts ...core.Option) (*core.Consumer[*sql.Tx], func()) {
	e.t.Helper()
	s, err := e.broker.Subscribe(e.queue)
	if err != nil {
		e.t.Fatal(err)
	}
	cons, err := core.NewLeased(s, e.store, h, append([]core.Option{core.WithName("test"), core.WithLogger(quietLogger()), fastBackoff}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); cons.Run(ctx) }()
	stop := func() { cancel(); <-done }
	e.t.Cleanup(stop)
	return cons, stop
}

// raceLeased runs n leased consumers on the queue until it is idle and
// returns their Processed and Duplicates summed.
func (e *env) raceLeased(h core.LeasedHandler[*sql.Tx, string], n int) (processed, duplicates int64) {
	e.t.Helper()
	var cs []*core.Consumer[*sql.Tx]
	var stops []func()
	for range n {
		c, stop := e.startLeased(h)
		cs, stops = append(cs, c), append(stops, stop)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.broker.WaitIdle(ctx, e.queue); err != nil {
		e.t.Fatalf("the queue was not idle within 30s: %v", err)
	}
	for i, c := range cs {
		stops[i]()
		processed += c.Stats().Processed
		duplicates += c.Stats().Duplicates
	}
	return processed, duplicates
}

// The External calls run outside any transaction: with one database
// connection and a window of 32, many run at once, each message's effect
// commits once, and a copy never calls out again after its original
// completed.
func TestLeasedExactlyOnceOutsideTransactions(t *testing.T) {
	e := newEnv(t)
	e.store.DB().SetMaxOpenConns(1)
	unique := ids(300, "pay")
	e.publish(unique...)
	e.publish(unique[:60]...) // copies, after their originals
	var c calls
	// The first calls wait for each other: were each holding the one
	// connection in a transaction, they could never all be running.
	const together = 16
	var arrived atomic.Int64
	allIn := make(chan struct{})
	h := core.LeasedHandler[*sql.Tx, string]{
		External: func(ctx context.Context, m *core.Message) (string, error) {
			c.add(m.ID)
			if n := arrived.Add(1); n == together {
				close(allIn)
			} else if n < together {
				select {
				case <-allIn:
				case <-time.After(20 * time.Second):
					t.Errorf("only %d External calls ran at once over one database connection; want %d", arrived.Load(), together)
				}
			}
			time.Sleep(time.Millisecond)
			return "charge-" + m.ID, nil
		},
		Complete: completeEffect,
	}
	res := e.drainLeased(h, core.WithWindow(32), core.WithBatchSize(8))
	e.assertExactlyOnce(unique)
	if res.Stats.Processed != 300 || res.Stats.Duplicates != 60 {
		t.Errorf("processed %d, duplicates %d; want 300 and 60", res.Stats.Processed, res.Stats.Duplicates)
	}
	for _, id := range unique {
		if n := c.of(id); n != 1 {
			t.Errorf("External called %d times for %s, want once", n, id)
		}
	}
	var body string
	if err := e.store.DB().QueryRow(`SELECT body FROM effects WHERE message_id = ?`, unique[7]).Scan(&body); err != nil || body != "charge-"+unique[7] {
		t.Errorf("effect of %s: %q, %v; want the External result", unique[7], body, err)
	}
	e.assertNoLeases(unique...)
}

// assertNoLeases checks that no lease is left on ids.
func (e *env) assertNoLeases(ids ...string) {
	e.t.Helper()
	infos, err := e.store.Lookup(context.Background(), "test", ids)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, in := range infos {
		if !in.LeaseUntil.IsZero() {
			e.t.Errorf("id %s still has a lease until %v (token %d)", in.ID, in.LeaseUntil, in.LeaseToken)
		}
	}
}

// A copy that arrives while the original's External call runs waits for
// the lease, asking again, and after one lease without an end is retried
// (ErrLeaseBusy): never applied and never acknowledged as a duplicate;
// once the original completed it is a Duplicate.
func TestLeasedCopyWhileInProgressRetries(t *testing.T) {
	e := newEnv(t)
	e.publish("a", "a")
	release := make(chan struct{})
	var o outcomes
	var once sync.Once
	o.hit = func(m *core.Message, out core.Outcome) {
		if out.Decision == core.Retry && errors.Is(out.Err, core.ErrLeaseBusy) {
			once.Do(func() { close(release) })
		}
	}
	var c calls
	h := core.LeasedHandler[*sql.Tx, string]{
		External: func(ctx context.Context, m *core.Message) (string, error) {
			if c.add(m.ID) == 1 {
				<-release
			}
			return "charged", nil
		},
		Complete: completeEffect,
		Lease:    100 * time.Millisecond,
	}
	var asked atomic.Int64
	res := e.drainLeased(h, core.WithObserver(o.observer(), stageCounter("lease", &asked)), core.WithWindow(4))
	e.assertExactlyOnce([]string{"a"})
	if n := c.of("a"); n != 1 {
		t.Errorf("External called %d times, want once", n)
	}
	var busy, dup, processed int
	for _, out := range o.of("a") {
		switch {
		case out.Decision == core.Retry && errors.Is(out.Err, core.ErrLeaseBusy):
			busy++
		case out.Decision == core.Duplicate:
			dup++
		case out.Decision == core.Processed:
			processed++
		default:
			t.Errorf("unexpected outcome %v (%v)", out.Decision, out.Err)
		}
	}
	if busy == 0 || dup != 1 || processed != 1 {
		t.Errorf("busy retries %d, duplicates %d, processed %d; want ≥1, 1, 1 (stats %+v)", busy, dup, processed, res.Stats)
	}
	if n := asked.Load(); n < int64(busy)+3 {
		t.Errorf("%d lease requests for 2 copies and %d busy retries: the copy did not ask again while it waited", n, busy)
	}
}

// stageCounter counts the ends of the stage name.
func stageCounter(name core.StageName, n *atomic.Int64) core.Observer {
	return stageFunc(func(s core.Stage) {
		if s.Name == name {
			n.Add(1)
		}
	})
}

// stageFunc is a StageObserver told of each stage's end.
type stageFunc func(core.Stage)

func (stageFunc) StartDecision(ctx context.Context, _ *core.Message) context.Context { return ctx }
func (stageFunc) EndDecision(context.Context, *core.Message, core.Outcome)           {}
func (stageFunc) StartStage(ctx context.Context, _ core.Stage) context.Context       { return ctx }
func (f stageFunc) EndStage(_ context.Context, s core.Stage, _ error)                { f(s) }

// A permanent External error dead-letters the message with its cause and
// releases the lease; Complete never runs. A transient error is retried and
// the next call completes.
func TestLeasedExternalErrors(t *testing.T) {
	e := newEnv(t)
	e.publish("bad", "flaky")
	var c calls
	var completed atomic.Int64
	h := core.LeasedHandler[*sql.Tx, string]{
		External: func(ctx context.Context, m *core.Message) (string, error) {
			n := c.add(m.ID)
			switch {
			case m.ID == "bad":
				return "", core.Permanent(errors.New("card declined"))
			case n == 1:
				return "", errors.New("provider answered 500")
			}
			return "ok", nil
		},
		Complete: func(ctx context.Context, tx *sql.Tx, m *core.Message, r string) error {
			completed.Add(1)
			return completeEffect(ctx, tx, m, r)
		},
	}
	var o outcomes
	e.drainLeased(h, core.WithObserver(o.observer()))
	e.assertExactlyOnce([]string{"flaky"})
	if n := c.of("flaky"); n != 2 {
		t.Errorf("flaky: External called %d times, want 2", n)
	}
	if n := completed.Load(); n != 1 {
		t.Errorf("Complete ran %d times, want once", n)
	}
	dl := e.broker.DeadLetters(e.queue)
	if len(dl) != 1 || dl[0].Message.ID != "bad" || !strings.Contains(dl[0].Cause.Error(), "card declined") || !strings.Contains(dl[0].Cause.Error(), "external") {
		t.Fatalf("dead letters %+v; want bad, parked with the cause at stage external", dl)
	}
	first := o.of("flaky")[0]
	var de *core.DecisionError
	if first.Decision != core.Retry || !errors.As(first.Err, &de) || de.Stage != "external" {
		t.Errorf("flaky's first outcome %v %v; want Retry at stage external", first.Decision, first.Err)
	}
	e.assertNoLeases("bad", "flaky")
}

// A consumer whose External call hangs past MaxLease loses its lease to
// the next delivery, which repeats the call and completes; the hung
// consumer, when its call returns at last, fails its fence and completes
// nothing.
func TestLeasedTakeOverFencesTheHungHolder(t *testing.T) {
	e := newEnv(t, memory.WithVisibilityTimeout(300*time.Millisecond))
	e.publish("x")
	wakeHung := make(chan struct{})
	hungDecided := make(chan core.Outcome, 1)
	var c calls
	h := core.LeasedHandler[*sql.Tx, string]{Complete: completeEffect, Lease: 150 * time.Millisecond, MaxLease: 300 * time.Millisecond}
	hungStarted := make(chan struct{})
	h.External = func(ctx context.Context, m *core.Message) (string, error) {
		c.add(m.ID)
		close(hungStarted)
		<-wakeHung // a provider that hangs, and a client that ignores its context
		return "late", nil
	}
	_, stopHung := e.startLeased(h, core.WithWindow(1), core.WithObserver(core.DecisionFunc(func(_ context.Context, m *core.Message, out core.Outcome) {
		select {
		case hungDecided <- out:
		default:
		}
	})))
	<-hungStarted
	h.External = func(ctx context.Context, m *core.Message) (string, error) {
		c.add(m.ID)
		close(wakeHung) // the hung call returns while this one runs
		select {
		case out := <-hungDecided:
			hungDecided <- out
		case <-time.After(10 * time.Second):
			t.Error("the hung consumer did not decide within 10s")
		}
		return "charged", nil
	}
	second, stopSecond := e.startLeased(h, core.WithWindow(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for second.Stats().Processed < 1 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	stopHung()
	stopSecond()
	hung := <-hungDecided
	if hung.Decision != core.Retry || !errors.Is(hung.Err, core.ErrLeaseLost) {
		t.Errorf("the hung consumer decided %v (%v); want Retry with ErrLeaseLost", hung.Decision, hung.Err)
	}
	if n := c.of("x"); n != 2 {
		t.Errorf("External called %d times, want 2 (the hung call and the takeover)", n)
	}
	e.assertExactlyOnce([]string{"x"})
	var body string
	if err := e.store.DB().QueryRow(`SELECT body FROM effects WHERE message_id = 'x'`).Scan(&body); err != nil || body != "charged" {
		t.Errorf("effect body %q, %v; want the takeover's result", body, err)
	}
	e.assertNoLeases("x")
}

// Two consumers racing on copies of one id: one External call at a time,
// one effect.
func TestLeasedRacingConsumers(t *testing.T) {
	e := newEnv(t)
	const copies = 6
	for range copies {
		e.publish("race")
	}
	var c calls
	var inside atomic.Int64
	h := core.LeasedHandler[*sql.Tx, string]{
		External: func(ctx context.Context, m *core.Message) (string, error) {
			if inside.Add(1) > 1 {
				t.Error("two External calls for one id ran at once")
			}
			defer inside.Add(-1)
			c.add(m.ID)
			time.Sleep(50 * time.Millisecond)
			return "charged", nil
		},
		Complete: completeEffect,
	}
	processed, duplicates := e.raceLeased(h, 2)
	e.assertExactlyOnce([]string{"race"})
	if n := c.of("race"); n != 1 {
		t.Errorf("External called %d times, want once", n)
	}
	if processed != 1 || duplicates != copies-1 {
		t.Errorf("processed %d, duplicates %d; want 1 and %d", processed, duplicates, copies-1)
	}
}

// NewLeased refuses a handler without steps, bad lease settings, and a
// store that cannot lease.
func TestNewLeasedValidates(t *testing.T) {
	e := newEnv(t)
	sub, err := e.broker.Subscribe(e.queue)
	if err != nil {
		t.Fatal(err)
	}
	ok := core.LeasedHandler[*sql.Tx, string]{
		External: func(context.Context, *core.Message) (string, error) { return "", nil },
		Complete: completeEffect,
	}
	noComplete := ok
	noComplete.Complete = nil
	short := ok
	short.Lease = time.Millisecond
	for name, h := range map[string]core.LeasedHandler[*sql.Tx, string]{"no Complete": noComplete, "short lease": short} {
		if _, err := core.NewLeased(sub, e.store, h, core.WithName("test")); err == nil {
			t.Errorf("%s: NewLeased accepted it", name)
		}
	}
	if _, err := core.NewLeased(sub, noLeases{e.store}, ok, core.WithName("test")); err == nil || !strings.Contains(err.Error(), "driver.Leaser") {
		t.Errorf("a store without leases: %v; want an error naming driver.Leaser", err)
	}
	if _, err := core.NewLeased(sub, e.store, ok); err == nil || !strings.Contains(err.Error(), "WithName") {
		t.Errorf("without WithName: %v", err)
	}
}

// noLeases hides a store's Leaser.
type noLeases struct{ driver.Store[*sql.Tx] }

// A payment whose charge is an HTTP call to a slow provider: the call
// runs outside any transaction under a lease, and the ledger row commits
// with the claim once it returned.
func ExampleNewLeased() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "idemq-example")
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE ledger (message_id TEXT, charge_id TEXT)`); err != nil {
		log.Fatal(err)
	}

	broker, err := memory.NewBroker()
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	err = core.NewPublisher(broker).Publish(ctx, "payments",
		&core.Message{ID: "pay-1", Body: []byte(`{"amount_cents": 1250}`)},
		&core.Message{ID: "pay-1", Body: []byte(`{"amount_cents": 1250}`)}) // a duplicate
	if err != nil {
		log.Fatal(err)
	}
	sub, err := broker.Subscribe("payments")
	if err != nil {
		log.Fatal(err)
	}

	// charge stands for a payment API client that sends the idempotency
	// key its context carries: effects.Keyer.ForMessage puts it there and
	// effects.Transport sends it, the same on every attempt.
	charge := func(ctx context.Context, body []byte) (string, error) { return "ch_1", nil }
	c, err := core.NewLeased(sub, store, core.LeasedHandler[*sql.Tx, string]{
		External: func(ctx context.Context, m *core.Message) (string, error) {
			return charge(ctx, m.Body)
		},
		Complete: func(ctx context.Context, tx *sql.Tx, m *core.Message, chargeID string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO ledger VALUES (?, ?)`, m.ID, chargeID)
			return err
		},
		Lease: 30 * time.Second, // renewed every 10s while the call runs
	}, core.WithName("payments"), core.WithWindow(500))
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(runCtx) }()
	broker.WaitIdle(ctx, "payments")
	stop()
	<-done

	var chargeID string
	store.DB().QueryRowContext(ctx, `SELECT charge_id FROM ledger WHERE message_id = 'pay-1'`).Scan(&chargeID)
	st := c.Stats()
	fmt.Printf("charge %s, processed: %d, duplicates: %d\n", chargeID, st.Processed, st.Duplicates)
	// Output: charge ch_1, processed: 1, duplicates: 1
}

// payer charges through a fake payment provider over HTTP, with the
// message's idempotency key, as a service's External would.
type payer struct {
	prov  *effectstest.Provider
	keyer *effects.Keyer
}

func newPayer(t *testing.T) *payer {
	t.Helper()
	prov := effectstest.NewProvider()
	t.Cleanup(prov.Close)
	keyer, err := effects.NewKeyer([]byte("core-leased-tests-secret-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	return &payer{prov: prov, keyer: keyer}
}

// charge is an External step: the body is the payment.
func (p *payer) charge(ctx context.Context, m *core.Message) (string, error) {
	ch, err := effectstest.PostCharge(p.keyer.ForMessage(ctx, m, "charge"), nil, p.prov.URL(),
		map[string]any{"account": "acc-" + m.ID, "amount_cents": len(m.Body)})
	return ch.ID, err
}

// Over HTTP: a provider that answers 500 and then 200 charges once; one
// that refuses the card dead-letters the message with the cause.
func TestLeasedProviderFailsThenAnswers(t *testing.T) {
	e := newEnv(t)
	p := newPayer(t)
	p.prov.FailNext(1, 500)
	e.publish("flaky")
	e.drainLeased(core.LeasedHandler[*sql.Tx, string]{External: p.charge, Complete: completeEffect})
	e.assertExactlyOnce([]string{"flaky"})
	if p.prov.Charges() != 1 || p.prov.Requests() != 2 {
		t.Errorf("provider: %d charges in %d requests; want 1 in 2", p.prov.Charges(), p.prov.Requests())
	}
	p.prov.FailNext(1, 402)
	e.publish("declined")
	e.drainLeased(core.LeasedHandler[*sql.Tx, string]{External: p.charge, Complete: completeEffect})
	dl := e.broker.DeadLetters(e.queue)
	if len(dl) != 1 || dl[0].Message.ID != "declined" || !strings.Contains(dl[0].Cause.Error(), "402") {
		t.Fatalf("dead letters %+v; want declined, parked with the provider's 402", dl)
	}
	e.assertNoLeases("flaky", "declined")
}

// Over HTTP: two consumers racing on six copies of one id make one
// request, and the provider charges once.
func TestLeasedRacingConsumersChargeOnce(t *testing.T) {
	e := newEnv(t)
	p := newPayer(t)
	p.prov.SetDelay(50 * time.Millisecond)
	for range 6 {
		e.publish("race")
	}
	e.raceLeased(core.LeasedHandler[*sql.Tx, string]{External: p.charge, Complete: completeEffect}, 2)
	e.assertExactlyOnce([]string{"race"})
	if p.prov.Charges() != 1 || p.prov.Requests() != 1 {
		t.Errorf("provider: %d charges in %d requests; want 1 in 1 (a copy must wait for the lease, not call)", p.prov.Charges(), p.prov.Requests())
	}
}

// Over HTTP: the provider hangs, and so does the consumer whose call it
// holds (its client ignores its context): its renewals stop at MaxLease,
// and its lease expires while the provider still hangs; a second consumer takes it over and
// calls with the same key, is told the key is in use (409) until the
// provider answers the first call, then gets the first charge replayed and
// completes. One charge, one effect, and the dead consumer completes
// nothing.
func TestLeasedLeaseExpiresWhileProviderHangs(t *testing.T) {
	e := newEnv(t, memory.WithVisibilityTimeout(300*time.Millisecond))
	p := newPayer(t)
	e.publish("hung")
	p.prov.Hang()
	h := core.LeasedHandler[*sql.Tx, string]{Complete: completeEffect, Lease: 150 * time.Millisecond, MaxLease: 300 * time.Millisecond}
	var deadOut outcomes
	calling := make(chan struct{})
	var once sync.Once
	h.External = func(ctx context.Context, m *core.Message) (string, error) {
		once.Do(func() { close(calling) })
		return p.charge(context.WithoutCancel(ctx), m) // hangs with the provider
	}
	_, stopDead := e.startLeased(h, core.WithWindow(1), core.WithObserver(deadOut.observer()))
	<-calling
	h.External = p.charge
	_, stopSecond := e.startLeased(h, core.WithWindow(1))
	// The second consumer waits out the lease, takes it over and is told
	// 409 while the first request hangs.
	deadline := time.Now().Add(20 * time.Second)
	for p.prov.Conflicts() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if p.prov.Conflicts() == 0 {
		t.Fatal("the second consumer never called the hanging provider with the same key")
	}
	p.prov.Unhang()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.broker.WaitIdle(ctx, e.queue); err != nil {
		t.Fatalf("not decided within 20s of the provider answering: %v", err)
	}
	stopSecond()
	stopDead()
	e.assertExactlyOnce([]string{"hung"})
	if p.prov.Charges() != 1 || p.prov.Replays() < 1 {
		t.Errorf("provider: %d charges, %d replays; want 1 charge, the later answers replayed", p.prov.Charges(), p.prov.Replays())
	}
	// The hung call's own completion: its lease was taken over (the other
	// consumer called with it), so it fails the fence or finds the claim
	// done. The consumer may complete a later delivery of its own.
	if outs := deadOut.of("hung"); len(outs) == 0 || outs[0].Decision == core.Processed {
		t.Errorf("the hung call's outcomes %v: it must not complete after its lease was taken over", outs)
	}
	e.assertNoLeases("hung")
}
