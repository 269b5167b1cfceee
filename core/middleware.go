package core

import "context"

// Handler applies a message's business effect inside the dedup transaction
// tx. It runs only for a message whose claim this transaction won. Its
// error decides the message: nil → Processed once the transaction commits;
// an error wrapped with Permanent → DeadLetter; any other error → Retry
// (DeadLetter after MaxAttempts). A handler must make its effects through
// tx: anything else (an HTTP call, an e-mail) escapes the rollback and may
// repeat on redelivery unless it carries an idempotency key.
type Handler[Tx any] func(ctx context.Context, tx Tx, m *Message) error

// BatchHandler applies the business effects of several messages at once
// inside the dedup transaction tx, for set-based effects (one multi-row
// INSERT or UPDATE for the whole batch). msgs are the messages whose claims
// this transaction won, in arrival order. nil → all Processed. On an error
// the transaction rolls back and each message is decided alone, in its own
// transaction, so the error is pinned on the message that causes it.
type BatchHandler[Tx any] func(ctx context.Context, tx Tx, msgs []*Message) error

// HandlerFunc is a Handler or BatchHandler as handler middleware sees it:
// the transaction is already bound. msgs holds one message for a Handler
// and the batch's won claims for a BatchHandler; it is valid only during
// the call.
type HandlerFunc func(ctx context.Context, msgs []*Message) error

// HandlerMiddleware wraps the handler inside the transaction: only messages
// whose claim won reach it. Timeouts and panic recovery live here.
type HandlerMiddleware func(next HandlerFunc) HandlerFunc

func chainHandler(mws []HandlerMiddleware, inner HandlerFunc) HandlerFunc {
	for i := len(mws) - 1; i >= 0; i-- {
		inner = mws[i](inner)
	}
	return inner
}
