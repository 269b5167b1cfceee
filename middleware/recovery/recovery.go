// Package recovery turns a panicking handler (New) or a leased consumer's
// panicking External call (External) into a transient error, so one bad
// message rolls back and is retried (then dead-lettered after MaxAttempts)
// instead of killing the consumer process.
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

// Error says the step panicked, with what.
func (p *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", p.Value) }

// New returns handler middleware (core.WithHandlerMiddleware) that
// recovers a panic in what runs inside the transaction (a Handler, a
// BatchHandler, a leased consumer's Complete), logs it with its stack and
// the first message's id at error level on logger (nil means
// slog.Default()), and returns a *PanicError. Install it innermost-but-one
// (after timeout) so that it sees the handler's own panics. A leased
// consumer's External call needs External.
func New(logger *slog.Logger) core.HandlerMiddleware {
	if logger == nil {
		logger = slog.Default()
	}
	return func(next core.HandlerCall) core.HandlerCall {
		return func(ctx context.Context, msgs []*core.Message) (err error) {
			defer recoverInto(ctx, logger, "handler", msgs, &err)
			return next(ctx, msgs)
		}
	}
}

// External returns external middleware (core.WithExternalMiddleware) that
// recovers a panic in a leased consumer's External call the way New does
// for handlers: logged, then a *PanicError, so the lease is released and
// the message retried.
func External(logger *slog.Logger) core.ExternalMiddleware {
	if logger == nil {
		logger = slog.Default()
	}
	return func(next core.ExternalCall) core.ExternalCall {
		return func(ctx context.Context, m *core.Message) (err error) {
			defer recoverInto(ctx, logger, "external call", []*core.Message{m}, &err)
			return next(ctx, m)
		}
	}
}

// recoverInto recovers a panic of the step named what, logs it and sets
// *err to a *PanicError.
func recoverInto(ctx context.Context, logger *slog.Logger, what string, msgs []*core.Message, err *error) {
	v := recover()
	if v == nil {
		return
	}
	stack := debug.Stack()
	attrs := []any{"messages", len(msgs), "panic", fmt.Sprint(v), "stack", string(stack)}
	if len(msgs) > 0 {
		m := msgs[0]
		attrs = append(attrs, "id", m.ID, "source", m.Source, "attempt", m.Attempt)
	}
	logger.ErrorContext(ctx, "idemq: "+what+" panicked; its messages are rolled back and retried", attrs...)
	*err = &PanicError{Value: v, Stack: stack}
}
