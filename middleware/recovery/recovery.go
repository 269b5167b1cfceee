// Package recovery turns a panicking handler into a transient error, so one
// bad message rolls back and is retried (then dead-lettered after
// MaxAttempts) instead of killing the consumer process.
package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/idemq/idemq/core"
)

// PanicError is the error a recovered panic becomes. It is transient: the
// message is retried, and dead-lettered after MaxAttempts.
type PanicError struct {
	Value any    // what the handler panicked with
	Stack []byte // the goroutine's stack at the panic
}

func (p *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", p.Value) }

// New returns handler middleware that recovers a panic in the handler (a
// Handler's or a BatchHandler's), logs it with its stack and the first
// message's id at error level on logger (nil means slog.Default()), and
// returns a *PanicError. Install it innermost-but-one
// (after timeout) so that it sees the handler's own panics.
func New(logger *slog.Logger) core.HandlerMiddleware {
	if logger == nil {
		logger = slog.Default()
	}
	return func(next core.HandlerFunc) core.HandlerFunc {
		return func(ctx context.Context, msgs []*core.Message) (err error) {
			defer func() {
				if v := recover(); v != nil {
					stack := debug.Stack()
					attrs := []any{"messages", len(msgs), "panic", fmt.Sprint(v), "stack", string(stack)}
					if len(msgs) > 0 {
						m := msgs[0]
						attrs = append(attrs, "id", m.ID, "source", m.Source, "attempt", m.Attempt)
					}
					logger.ErrorContext(ctx, "idemq: handler panicked; its messages are rolled back and retried", attrs...)
					err = &PanicError{Value: v, Stack: stack}
				}
			}()
			return next(ctx, msgs)
		}
	}
}
