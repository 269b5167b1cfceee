// Package timeout bounds how long a handler may run inside its transaction.
package timeout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/core"
)

// ErrTimeout is wrapped by the error of a handler that overran its limit.
// It is transient: the message is rolled back and retried.
var ErrTimeout = errors.New("handler timed out")

// New returns handler middleware that gives each handler call a context
// with deadline d (a BatchHandler's call: d for the whole batch). The handler must pass that context to its database
// calls (every driver honours it): a handler cannot be abandoned while it
// holds the transaction, so the deadline works by making its next database
// call fail. An error after the deadline is reported as ErrTimeout.
// d must be positive; New panics otherwise, at start-up.
func New(d time.Duration) core.HandlerMiddleware {
	if d <= 0 {
		panic(fmt.Sprintf("timeout.New: duration %v must be positive", d))
	}
	return func(next core.HandlerFunc) core.HandlerFunc {
		return func(ctx context.Context, msgs []*core.Message) error {
			start := time.Now()
			tctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			err := next(tctx, msgs)
			// The clock decides, not only tctx.Err(): on a loaded machine
			// the deadline's timer fires late, and a handler that returned
			// just after its deadline would otherwise pass for in time.
			overran := time.Since(start) >= d || errors.Is(tctx.Err(), context.DeadlineExceeded)
			if err == nil && !overran {
				return nil
			}
			if overran && ctx.Err() == nil {
				// Even a handler that returned nil after its deadline may
				// have had its last statements cancelled: do not commit.
				if err == nil {
					err = context.DeadlineExceeded
				}
				return fmt.Errorf("%w after %v: %w", ErrTimeout, d, err)
			}
			return err
		}
	}
}
