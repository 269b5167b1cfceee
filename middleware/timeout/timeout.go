// Package timeout bounds how long a step may run: New bounds what runs
// inside the transaction (a Handler, a BatchHandler, a leased consumer's
// Complete), External bounds a leased consumer's External call, which
// runs outside any transaction.
package timeout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/core"
)

// ErrTimeout is wrapped by the error of a step that overran its limit.
// It is transient: the message is rolled back and retried.
var ErrTimeout = errors.New("handler timed out")

// New returns handler middleware (core.WithHandlerMiddleware) that gives
// each call inside the transaction a context with deadline d (a
// BatchHandler's call: d for the whole batch). The handler must pass that
// context to its database calls (every driver honours it): a handler
// cannot be abandoned while it holds the transaction, so the deadline
// works by making its next database call fail. An error after the
// deadline, or nil after it (its last statements may have been cancelled:
// the transaction must not commit), is reported as ErrTimeout. It does not
// bound a leased consumer's External call: External does. d must be
// positive; New panics otherwise, at start-up.
func New(d time.Duration) core.HandlerMiddleware {
	check("New", d)
	return func(next core.HandlerCall) core.HandlerCall {
		return func(ctx context.Context, msgs []*core.Message) error {
			return bound(ctx, d, true, func(ctx context.Context) error { return next(ctx, msgs) })
		}
	}
}

// External returns external middleware (core.WithExternalMiddleware) that
// gives a leased consumer's External call a context with deadline d, for a
// provider's call that should fail fast rather than run up to MaxLease. An
// error after the deadline is reported as ErrTimeout and retried with the
// same idempotency key; a call that returned its result, even late, keeps
// it. d must be positive; External panics otherwise, at start-up.
func External(d time.Duration) core.ExternalMiddleware {
	check("External", d)
	return func(next core.ExternalCall) core.ExternalCall {
		return func(ctx context.Context, m *core.Message) error {
			return bound(ctx, d, false, func(ctx context.Context) error { return next(ctx, m) })
		}
	}
}

func check(name string, d time.Duration) {
	if d <= 0 {
		panic(fmt.Sprintf("timeout.%s: duration %v must be positive", name, d))
	}
}

// bound runs call with deadline d. lateIsError turns a nil returned after
// the deadline into ErrTimeout.
func bound(ctx context.Context, d time.Duration, lateIsError bool, call func(context.Context) error) error {
	start := time.Now()
	tctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	err := call(tctx)
	// The clock decides, not only tctx.Err(): on a loaded machine the
	// deadline's timer fires late, and a call that returned just after its
	// deadline would otherwise pass for in time.
	overran := time.Since(start) >= d || errors.Is(tctx.Err(), context.DeadlineExceeded)
	if !overran || ctx.Err() != nil || (err == nil && !lateIsError) {
		return err
	}
	if err == nil {
		err = context.DeadlineExceeded
	}
	return fmt.Errorf("%w after %v: %w", ErrTimeout, d, err)
}
