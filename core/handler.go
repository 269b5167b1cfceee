package core

import (
	"context"
)

// Handler applies a message's business effect inside the dedup transaction
// tx. It runs only for a message whose claim this transaction won. Its
// error decides the message: nil → Processed once the transaction commits;
// an error wrapped with Permanent → DeadLetter; any other error → Retry
// (DeadLetter after MaxAttempts). A handler must make its effects through
// tx: anything else (an HTTP call, an e-mail) escapes the rollback and may
// repeat on redelivery unless it carries an idempotency key; a slow call
// belongs in a leased consumer's External step (NewLeased).
type Handler[Tx any] func(ctx context.Context, tx Tx, m *Message) error

// BatchHandler applies the business effects of several messages at once
// inside the dedup transaction tx, for set-based effects (one multi-row
// INSERT or UPDATE for the whole batch). msgs are the messages whose claims
// this transaction won, in arrival order. nil → all Processed. On an error
// the transaction rolls back and each message is decided alone, in its own
// transaction, so the error is pinned on the message that causes it.
type BatchHandler[Tx any] func(ctx context.Context, tx Tx, msgs []*Message) error

// HandlerCall is what runs inside a dedup transaction, as handler
// middleware sees it, with the transaction already bound: a Handler (msgs
// holds its one message), a BatchHandler (the batch's won claims) or a
// leased consumer's Complete (its one message). msgs is valid only during
// the call.
type HandlerCall func(ctx context.Context, msgs []*Message) error

// HandlerMiddleware wraps what runs inside the transaction: only messages
// whose claim won reach it, and its context ends with the transaction
// (WithTransactionTimeout). Panic recovery and handler timeouts live here
// (middleware/recovery, middleware/timeout). It never wraps a leased
// consumer's External call, which runs outside any transaction: that one
// has ExternalMiddleware.
type HandlerMiddleware func(next HandlerCall) HandlerCall

// ExternalCall is a leased consumer's External call as external middleware
// sees it (its result is kept for Complete): it runs outside any
// transaction, under the message's lease, at most MaxLease.
type ExternalCall func(ctx context.Context, m *Message) error

// ExternalMiddleware wraps a leased consumer's External call (NewLeased):
// a timeout for the provider's call, panic recovery, a circuit breaker.
type ExternalMiddleware func(next ExternalCall) ExternalCall

// chain wraps inner in mws, the first given outermost.
func chain[F any, M ~func(F) F](mws []M, inner F) F {
	for i := len(mws) - 1; i >= 0; i-- {
		inner = mws[i](inner)
	}
	return inner
}
