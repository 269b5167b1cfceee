package core_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// downStore wraps a real store and, while down is set, refuses every new
// transaction, as a database that stopped answering does. It counts the
// transactions asked for.
type downStore struct {
	driver.Store[*sql.Tx]
	down   atomic.Bool
	begins atomic.Int64
}

var errRefused = errors.New("injected: connection refused")

func (s *downStore) Begin(ctx context.Context) (driver.Txn[*sql.Tx], error) {
	s.begins.Add(1)
	if s.down.Load() {
		return nil, errRefused
	}
	return s.Store.Begin(ctx)
}

// handlerOn returns the tests' effect handler that fails, as its SQL would,
// while s is down.
func handlerOn(s *downStore) core.Handler[*sql.Tx] {
	return func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if s.down.Load() {
			return errors.New("injected: connection lost")
		}
		return applyEffect(ctx, tx, m)
	}
}

// While the store does not answer, the Consumer takes no new deliveries,
// hands nothing back to the broker (which would spend a delivery of each
// message, and under a delivery limit park healthy ones), probes the store
// with backoff instead of spinning, and applies everything once when it
// answers again.
func TestStoreOutagePausesDeliveries(t *testing.T) {
	e := newEnv(t)
	want := ids(400, "o")
	e.publish(want...)
	ds := &downStore{Store: e.store}
	sub, err := e.broker.Subscribe(e.queue)
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New[*sql.Tx](sub, ds, handlerOn(ds), core.WithName("test"), core.WithLogger(quietLogger()),
		core.WithBatchSize(10), core.WithConcurrency(2), core.WithWindow(40),
		core.WithStoreProbe(10*time.Millisecond, 50*time.Millisecond),
		core.WithBackoff(core.ConstantBackoff(time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	servicetest.WaitFor(t, 30*time.Second, "50 messages applied", func() bool { return c.Stats().Processed >= 50 })
	ds.down.Store(true)
	servicetest.WaitFor(t, 30*time.Second, "the Consumer to pause", func() bool { return c.Stats().StoreOutages == 1 })
	// The outage goes on for a second: the Consumer holds what it has.
	before, begins := e.broker.Stats(e.queue), ds.begins.Load()
	time.Sleep(time.Second)
	during, probes := e.broker.Stats(e.queue), ds.begins.Load()-begins
	if during.Delivered-before.Delivered > 1 {
		t.Errorf("%d deliveries taken during the outage, want at most the one the receive loop waited on", during.Delivered-before.Delivered)
	}
	if during.Retried != 0 || during.Redelivered != 0 || c.Stats().Retried != 0 {
		t.Errorf("messages handed back during the outage: broker %+v, consumer %+v", during, c.Stats())
	}
	// Probes back off to 50ms (±20%): about 20 in the second. A consumer
	// spinning on the broker asks for thousands.
	if probes < 2 || probes > 60 {
		t.Errorf("%d transactions asked for during a second of outage, want a probe every ~50ms", probes)
	}
	ds.down.Store(false)
	servicetest.WaitFor(t, 30*time.Second, "every message applied", func() bool { return e.broker.Len(e.queue) == 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.assertExactlyOnce(want)
	st, bs := c.Stats(), e.broker.Stats(e.queue)
	if bs.Redelivered != 0 || bs.Retried != 0 || st.Retried != 0 {
		t.Errorf("the outage spent deliveries: broker %+v, consumer %+v", bs, st)
	}
	if st.StoreOutages != 1 || st.StoreRetries == 0 {
		t.Errorf("stats %+v: want one outage and the held messages run again", st)
	}
	t.Logf("%d probes in a second of outage; stats %+v", probes, st)
}

// A Consumer asked to stop while the store does not answer returns without
// waiting out its shutdown timeout, and leaves what it held to the broker,
// spending nothing.
func TestShutdownDuringStoreOutage(t *testing.T) {
	e := newEnv(t)
	want := ids(20, "s")
	e.publish(want...)
	ds := &downStore{Store: e.store}
	ds.down.Store(true)
	sub, err := e.broker.Subscribe(e.queue)
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New[*sql.Tx](sub, ds, handlerOn(ds), core.WithName("test"), core.WithLogger(quietLogger()),
		core.WithBatchSize(5), core.WithShutdownTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	servicetest.WaitFor(t, 30*time.Second, "the Consumer to pause", func() bool { return c.Stats().StoreOutages == 1 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of its cancellation, with a shutdown timeout of an hour: it waits for the store")
	}
	st := c.Stats()
	if st.Unsettled == 0 || st.Retried != st.Unsettled || st.Processed != 0 {
		t.Errorf("stats %+v: want the held messages left unsettled", st)
	}
	if bs := e.broker.Stats(e.queue); bs.Retried != 0 {
		t.Errorf("broker %+v: messages handed back with a Retry", bs)
	}
	ds.down.Store(false)
	e.runUntilIdle(30*time.Second, handlerOn(ds))
	e.assertExactlyOnce(want)
}

// A handler failure while the store answers is the handler's: decided
// Retry and handed back to the broker, as always.
func TestHandlerFailureWithTheStoreUpIsRetried(t *testing.T) {
	e := newEnv(t)
	e.publish("h")
	var failed atomic.Bool
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if failed.CompareAndSwap(false, true) {
			return errors.New("the handler's own trouble")
		}
		return applyEffect(ctx, tx, m)
	}
	e.runUntilIdle(30*time.Second, h, core.WithBackoff(core.ConstantBackoff(time.Millisecond)))
	e.assertExactlyOnce([]string{"h"})
	if bs := e.broker.Stats(e.queue); bs.Retried != 1 {
		t.Errorf("broker %+v: want the handler failure handed back once", bs)
	}
}

// A handler's context carries the transaction's deadline
// (WithTransactionTimeout) and the pipeline's values, observed or not.
func TestHandlersSeeTheTransactionDeadline(t *testing.T) {
	for _, p := range pipelines {
		t.Run(p.name, func(t *testing.T) {
			e := newEnv(t)
			e.publish("d1", "d2")
			var bad atomic.Int64
			h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
				if d, ok := ctx.Deadline(); !ok || time.Until(d) > time.Minute || core.ConsumerName(ctx) != "test" {
					bad.Add(1)
				}
				return applyEffect(ctx, tx, m)
			}
			e.runUntilIdle(30*time.Second, h, append([]core.Option{core.WithTransactionTimeout(time.Minute)}, p.opts...)...)
			e.assertExactlyOnce([]string{"d1", "d2"})
			if bad.Load() != 0 {
				t.Errorf("%d handler calls without the transaction's deadline or the consumer's name", bad.Load())
			}
		})
	}
}
