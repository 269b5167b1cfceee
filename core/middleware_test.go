package core_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/timeout"
)

// countCalls is handler middleware that counts the calls it wraps.
func countCalls(n *atomic.Int64) core.HandlerMiddleware {
	return func(next core.HandlerCall) core.HandlerCall {
		return func(ctx context.Context, msgs []*core.Message) error {
			n.Add(int64(len(msgs)))
			return next(ctx, msgs)
		}
	}
}

// countExternal is external middleware that counts the calls it wraps.
func countExternal(n *atomic.Int64) core.ExternalMiddleware {
	return func(next core.ExternalCall) core.ExternalCall {
		return func(ctx context.Context, m *core.Message) error {
			n.Add(1)
			return next(ctx, m)
		}
	}
}

// slowExternal stands for a provider's call that takes d, or ends with its
// context.
func slowExternal(d time.Duration, cut *atomic.Int64) func(ctx context.Context, m *core.Message) (string, error) {
	return func(ctx context.Context, m *core.Message) (string, error) {
		select {
		case <-time.After(d):
			return "charged " + m.ID, nil
		case <-ctx.Done():
			cut.Add(1)
			return "", ctx.Err()
		}
	}
}

// A timeout written for handlers bounds what runs inside the transaction
// (Complete, under a leased consumer) and never a leased consumer's
// External call, which runs outside it; an External timeout cuts that
// call. The store is SQLite, the effects are its rows.
func TestLeasedMiddlewareKnowsItsStep(t *testing.T) {
	t.Run("handler timeout leaves External alone", func(t *testing.T) {
		e := newEnv(t)
		want := ids(5, "slow")
		e.publish(want...)
		var wrappedComplete, wrappedExternal, cut atomic.Int64
		res := e.drainLeased(core.LeasedHandler[*sql.Tx, string]{
			// Four times the handlers' timeout.
			External: slowExternal(200*time.Millisecond, &cut),
			Complete: completeEffect,
		}, core.WithHandlerMiddleware(timeout.New(50*time.Millisecond), countCalls(&wrappedComplete)),
			core.WithExternalMiddleware(countExternal(&wrappedExternal)), core.WithWindow(5))
		e.assertExactlyOnce(want)
		if cut.Load() != 0 {
			t.Errorf("%d External calls were cut: the handlers' timeout reached them", cut.Load())
		}
		if res.Processed != 5 || res.Retried != 0 || res.DeadLettered != 0 {
			t.Errorf("stats %+v: want 5 processed, no retries or dead letters", res)
		}
		if wrappedComplete.Load() != 5 || wrappedExternal.Load() != 5 {
			t.Errorf("handler middleware wrapped %d Completes, external middleware %d External calls; want 5 and 5",
				wrappedComplete.Load(), wrappedExternal.Load())
		}
	})
	t.Run("External timeout cuts External", func(t *testing.T) {
		e := newEnv(t)
		e.publish("hung")
		var cut atomic.Int64
		var o outcomes
		res := e.drainLeased(core.LeasedHandler[*sql.Tx, string]{
			External: slowExternal(time.Minute, &cut),
			Complete: completeEffect,
		}, core.WithExternalMiddleware(timeout.External(50*time.Millisecond)), core.WithMaxAttempts(2), core.WithObserver(o.observer()))
		if got := e.effects(); len(got) != 0 {
			t.Errorf("effects %v: a cut External call completed", got)
		}
		if cut.Load() != 2 {
			t.Errorf("%d External calls cut, want 2 (one per attempt)", cut.Load())
		}
		outs := o.of("hung")
		if res.DeadLettered != 1 || len(outs) != 2 {
			t.Fatalf("stats %+v, outcomes %v: want a retry, then a dead letter", res, outs)
		}
		for _, out := range outs {
			var de *core.DecisionError
			if !errors.As(out.Err, &de) || de.Stage != core.StageExternal || !errors.Is(out.Err, timeout.ErrTimeout) {
				t.Errorf("outcome %v: want a timeout at stage external", out)
			}
		}
	})
	t.Run("New refuses external middleware", func(t *testing.T) {
		e := newEnv(t)
		sub, err := e.broker.Subscribe(e.queue)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		_, err = core.New(sub, e.store, applyEffect, core.WithName("test"), core.WithExternalMiddleware(timeout.External(time.Second)))
		if err == nil || !strings.Contains(err.Error(), "WithExternalMiddleware") {
			t.Errorf("New with WithExternalMiddleware: %v, want an error naming the option", err)
		}
	})
}
