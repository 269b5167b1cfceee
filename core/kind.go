package core

import (
	"context"

	"github.com/idemq/idemq/core/driver"
)

// kind is what a handler kind adds to the one pipeline that every
// Consumer runs: the constructor (New, NewBatch, NewLeased) chooses it
// once.
type kind[Tx any] interface {
	// background does the kind's own work beside the pipeline until ctx
	// ends, and returns when it has stopped.
	background(ctx context.Context)
	// admit hands a message whose id and limits checked out on towards a
	// worker's transaction.
	admit(it *item)
	// fence runs in a transaction after its claims, with the indices of
	// the claims won, and returns those whose effects may be applied;
	// outs gets the decisions of the others.
	fence(ctx context.Context, txn driver.Txn[Tx], items []*item, won []int, outs []Outcome) ([]int, error)
	// apply runs the user's code inside the transaction for the claims
	// won.
	apply(ctx, hctx context.Context, txn driver.Txn[Tx], items []*item, won []int, outs []Outcome) applyResult
	// decided is told the final outcomes of a batch, before they are
	// settled.
	decided(items []*item, outs []Outcome)
	// inOrder reports whether one worker decides messages in the order
	// received (so a source may hand out a key's next messages early).
	inOrder() bool
}

// perMessage is New's kind: a Handler per message.
type perMessage[Tx any] struct {
	c *Consumer[Tx]
	h Handler[Tx]
	// call is h for applyEach, made once by New.
	call func(ctx context.Context, tx Tx, it *item) error
}

func (k *perMessage[Tx]) background(context.Context) {}

// admit queues it for a worker; the queue holds a window, so this never
// blocks.
func (k *perMessage[Tx]) admit(it *item) { k.c.enqueue(it) }

func (k *perMessage[Tx]) fence(_ context.Context, _ driver.Txn[Tx], _ []*item, won []int, _ []Outcome) ([]int, error) {
	return won, nil
}

func (k *perMessage[Tx]) apply(ctx, _ context.Context, txn driver.Txn[Tx], items []*item, won []int, outs []Outcome) applyResult {
	return k.c.applyEach(ctx, txn, items, won, outs, k.call)
}

func (k *perMessage[Tx]) decided([]*item, []Outcome) {}

func (k *perMessage[Tx]) inOrder() bool { return true }

// batchKind is NewBatch's kind: one BatchHandler call per transaction.
type batchKind[Tx any] struct {
	c *Consumer[Tx]
	h BatchHandler[Tx]
}

func (k *batchKind[Tx]) background(context.Context) {}

func (k *batchKind[Tx]) admit(it *item) { k.c.enqueue(it) }

func (k *batchKind[Tx]) fence(_ context.Context, _ driver.Txn[Tx], _ []*item, won []int, _ []Outcome) ([]int, error) {
	return won, nil
}

func (k *batchKind[Tx]) apply(_, hctx context.Context, txn driver.Txn[Tx], items []*item, won []int, outs []Outcome) applyResult {
	return k.c.applyBatch(hctx, items, won, outs, func(hctx context.Context, msgs []*Message) error {
		return k.h(hctx, txn.Tx(), msgs)
	})
}

func (k *batchKind[Tx]) decided([]*item, []Outcome) {}

func (k *batchKind[Tx]) inOrder() bool { return true }
