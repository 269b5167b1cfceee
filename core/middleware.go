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
// Handler middleware does not wrap a BatchHandler.
type BatchHandler[Tx any] func(ctx context.Context, tx Tx, msgs []*Message) error

// ProcessFunc decides one message: the whole claim–handle–commit path, as
// seen by decision middleware. It returns the message's Outcome, which the
// Consumer then settles with the broker.
type ProcessFunc func(ctx context.Context, m *Message) Outcome

// Middleware wraps the decision of each message, like net/http middleware
// wraps a Handler. It sees every decision, Duplicate and DeadLetter
// included, and is where tracing, metrics and logging live. The context it
// passes to next is the one the handler (and the store's claim and commit)
// will see, so a span started here parents them.
type Middleware func(next ProcessFunc) ProcessFunc

// HandlerFunc is the handler as handler middleware sees it: the
// transaction is already bound.
type HandlerFunc func(ctx context.Context, m *Message) error

// HandlerMiddleware wraps the handler inside the transaction: only messages
// whose claim won reach it. Timeouts and panic recovery live here.
type HandlerMiddleware func(next HandlerFunc) HandlerFunc

// StageObserver is told about the store stages of each batch: "begin",
// "claim" and "commit". ctxs are the contexts of the batch's messages as
// their decision middleware passed them, so tracing can record a child span
// per message (or one span linked to all). The returned func is called with
// the stage's error when it ends.
type StageObserver interface {
	ObserveStage(ctxs []context.Context, stage string) (end func(err error))
}

func chainMiddleware(mws []Middleware, inner ProcessFunc) ProcessFunc {
	for i := len(mws) - 1; i >= 0; i-- {
		inner = mws[i](inner)
	}
	return inner
}

func chainHandler(mws []HandlerMiddleware, inner HandlerFunc) HandlerFunc {
	for i := len(mws) - 1; i >= 0; i-- {
		inner = mws[i](inner)
	}
	return inner
}
