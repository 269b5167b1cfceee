package core

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemq/idemq/core/driver/retry"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// A store that stops answering must not turn every message in flight into
// a Retry: each Retry spends one of the broker's deliveries (SQS
// maxReceiveCount, a quorum queue's delivery-limit), so a short database
// outage would park healthy messages, and the retries hammer the database
// as it comes back. Instead the worker whose transaction failed at a store
// step probes the store; if it does not answer, the Consumer pauses: the
// receive loop takes no new deliveries, the workers hold what they have,
// and one prober pings the store (or opens and rolls back a transaction)
// with backoff until it answers. Then the held transactions run again, spending nothing.

// storeError is a transaction that failed at a step of the store's own
// (begin, claim, commit), not in a handler.
type storeError struct {
	stage StageName
	err   error
	// handler is set when a handler (or its flush) failed: that is the
	// store's trouble only if the store does not answer a probe either.
	handler bool
}

// quickReruns bounds the immediate re-runs of a transaction that failed
// while the store answers probes (a connection dropped from the pool, a
// deadlock, a serialization failure): after that many, the messages are
// decided Retry and the broker redelivers them, so an error that repeats
// whenever the transaction runs cannot hold a worker forever.
const quickReruns = 2

// outage is the Consumer's view of its store's health.
type outage struct {
	mu    sync.Mutex // held while a worker decides whether the store is down
	began time.Time
	// paused is closed when a store that stopped answering answers again;
	// nil while it answers. The receive loop reads it without the mutex.
	paused atomic.Pointer[chan struct{}]
}

// waitStore blocks the receive loop while the store is unreachable. It
// reports false when ctx ended first.
func (c *Consumer[Tx]) waitStore(ctx context.Context) bool {
	p := c.outage.paused.Load()
	if p == nil {
		return true
	}
	select {
	case <-*p:
		return true
	case <-ctx.Done():
		return false
	}
}

// awaitStore is called by a worker whose transaction failed at a store
// step. It reports whether to run the transaction again now: after the
// store was unreachable and answers again, always; when the store answers
// the first probe, for the first quickReruns failures of a batch (counted
// in reruns). It reports false at shutdown (stopping is true then) and when
// the messages should be handed back to the broker instead.
func (c *Consumer[Tx]) awaitStore(serr *storeError, reruns *int) (again, stopping bool) {
	o := &c.outage
	o.mu.Lock()
	up := o.paused.Load()
	if up == nil {
		perr := c.probe()
		if perr == nil {
			o.mu.Unlock()
			if (!serr.handler || c.conflict(serr.err)) && *reruns < quickReruns {
				*reruns++
				return true, false
			}
			return false, false
		}
		ch := make(chan struct{})
		up, o.began = &ch, time.Now()
		o.paused.Store(up)
		c.stats.storeOutages.Add(1)
		c.log.Warn("idemq: the store does not answer; pausing deliveries until it does",
			"stage", serr.stage, "err", serr.err, "probe_err", perr)
		go c.probeUntilUp(ch)
	}
	o.mu.Unlock()
	select {
	case <-*up:
		*reruns = 0
		return true, false
	case <-c.procCtx.Done():
		return false, true
	case <-c.stopping.Done():
		return false, true
	}
}

// conflict reports err as the store's own word for a transaction a
// concurrent one aborted (driver.Conflicter), worth running again at once
// even when it came from a handler's statement.
func (c *Consumer[Tx]) conflict(err error) bool {
	cf, ok := c.store.(driver.Conflicter)
	return ok && cf.Conflict(err)
}

// probeUntilUp probes the store with backoff until it answers, then lifts
// the pause by closing up; it gives up when the Consumer stops.
func (c *Consumer[Tx]) probeUntilUp(up chan struct{}) {
	o := &c.outage
	bo := retry.New(c.cfg.probeFirst, c.cfg.probeMax)
	probes := 1
	for {
		if !retry.Sleep(c.stopping, bo.Next()) {
			return
		}
		probes++
		if err := c.probe(); err != nil {
			c.log.Debug("idemq: the store still does not answer", "err", err, "probes", probes)
			continue
		}
		o.mu.Lock()
		c.log.Info("idemq: the store answers again; resuming deliveries",
			"outage", time.Since(o.began).Round(time.Millisecond), "probes", probes)
		o.paused.Store(nil)
		close(up)
		o.mu.Unlock()
		return
	}
}

// probe checks that the store answers: Ping where the store has it,
// otherwise a transaction opened and rolled back.
func (c *Consumer[Tx]) probe() error {
	ctx, cancel := context.WithTimeout(c.procCtx, c.cfg.probeTimeout)
	defer cancel()
	if p, ok := c.store.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	txn, err := c.store.Begin(ctx)
	if err != nil {
		return err
	}
	return txn.Rollback(ctx)
}

// storeShutdown decides the messages at indices g, held while the store
// did not answer, at shutdown: left unsettled for the broker to redeliver,
// spending nothing.
func (c *Consumer[Tx]) storeShutdown(items []*item, g []int, outs []Outcome, serr *storeError) {
	for _, i := range g {
		outs[i] = Outcome{Decision: Retry, Err: &DecisionError{MessageID: items[i].m.ID, Stage: serr.stage,
			Err: fmt.Errorf("%w: the store did not answer: %v", ErrShutdown, serr.err)}}
	}
}

// asStoreError reports a store step's transient failure as a *storeError.
func asStoreError(stage StageName, err error) *storeError {
	if err == nil || IsPermanent(err) || errors.Is(err, ErrShutdown) {
		return nil
	}
	return &storeError{stage: stage, err: err}
}

// asHandlerError reports a handler's transient failure as a *storeError
// to check the store against.
func asHandlerError(err error) *storeError {
	if s := asStoreError(StageHandler, err); s != nil {
		s.handler = true
		return s
	}
	return nil
}

// handlerTrouble returns the first transient handler failure among the
// outcomes of won, as a *storeError to check the store against.
func (c *Consumer[Tx]) handlerTrouble(items []*item, won []int, outs []Outcome) *storeError {
	for _, i := range won {
		if o := outs[i]; o.Decision == Retry && o.Err != nil {
			var de *DecisionError
			if errors.As(o.Err, &de) && de.Stage == StageHandler {
				return asHandlerError(de.Err)
			}
		}
	}
	return nil
}

// txnContext is a handler's context: the transaction's deadline and
// cancellation with the values (trace spans, consumer name) of the
// message's own context.
type txnContext struct {
	context.Context // the transaction's
	values          context.Context
}

func (t txnContext) Value(key any) any { return t.values.Value(key) }
