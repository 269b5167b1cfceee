package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idemq/idemq/core/driver"
)

// processBatch decides one batch in one transaction: one claim for all
// distinct ids, the handler for each claim won, one commit. It hands the
// outcomes to a settling goroutine and returns to take the next batch.
func (c *Consumer[Tx]) processBatch(items []*item, sc *scratch) {
	if c.orders != nil {
		if items = c.admitOrdered(items); len(items) == 0 {
			return
		}
	}
	// The same id twice in one batch (a duplicate publish landing close
	// to its original): only the first is claimed; the others follow its
	// outcome.
	primaries := sc.primaries[:0]
	var followers map[int][]*item
	if sc.index == nil {
		sc.index = make(map[string]int, len(items))
	}
	index := sc.index
	clear(index)
	for _, it := range items {
		if p, ok := index[it.m.ID]; ok {
			if followers == nil {
				followers = make(map[int][]*item)
			}
			followers[p] = append(followers[p], it)
			continue
		}
		index[it.m.ID] = len(primaries)
		primaries = append(primaries, it)
	}
	sc.primaries = primaries

	sc.outs = slices.Grow(sc.outs[:0], len(primaries))[:len(primaries)]
	clear(sc.outs)
	outs := sc.outs
	c.decideBatch(primaries, outs, sc)
	c.kind.decided(primaries, outs)
	batch := make([]settlement, 0, len(items))
	for i, it := range primaries {
		batch = append(batch, settlement{it: it, out: outs[i]})
		for _, f := range followers[i] {
			out := c.followerOutcome(it, outs[i], f)
			if it.heldBack {
				out = heldBack(f)
			}
			batch = append(batch, settlement{it: f, out: out})
		}
	}
	if c.orders != nil {
		c.holdKeys(batch)
	}
	c.settleAsync(batch)
}

// scratch is what a worker reuses from one batch to the next, so that a
// batch's own bookkeeping allocates nothing once the worker is warm.
type scratch struct {
	primaries []*item
	index     map[string]int
	outs      []Outcome
	order     []int
	claims    []driver.Claim
	result    []driver.ClaimResult
}

// decideBatch decides items in as few transactions as failures allow,
// usually one, writing their outcomes into outs (zeroed, one per item). A
// group whose transaction must be re-run (a failed handler under
// IsolateReplay, or a failed BatchHandler) comes back as new groups.
func (c *Consumer[Tx]) decideBatch(items []*item, outs []Outcome, sc *scratch) {
	all := make([]int, len(items))
	for i := range all {
		all[i] = i
	}
	groups := [][]int{all}
	reruns := 0
	for len(groups) > 0 {
		g := groups[0]
		more, serr := c.runTxn(items, g, outs, sc)
		if serr != nil && c.procCtx.Err() == nil {
			again, stopping := c.awaitStore(serr, &reruns)
			if stopping {
				c.storeShutdown(items, g, outs, serr)
			}
			if again {
				c.stats.storeRetries.Add(int64(len(g)))
				continue // the same group, in a new transaction
			}
		}
		for _, i := range g {
			c.failKey(items, i, outs[i])
		}
		groups = append(groups[1:], more...)
	}
}

// runTxn decides the items at indices g in one transaction, writing their
// outcomes into outs. It returns groups of indices to decide again in new
// transactions; every such group is smaller than g, so decideBatch ends.
// When a step of the store's own failed (begin, claim, commit) it also
// returns that failure: the outcomes in outs are then Retry, and the caller
// may run g again instead.
func (c *Consumer[Tx]) runTxn(items []*item, g []int, outs []Outcome, sc *scratch) (rerun [][]int, serr *storeError) {
	ctx := c.procCtx
	if c.cfg.txnTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.txnTimeout)
		defer cancel()
	}
	if c.orders != nil && len(items[g[0]].order.failed) > 0 {
		// A key retried earlier in the batch: its later messages go back.
		g = slices.DeleteFunc(slices.Clone(g), func(i int) bool {
			if c.keyFailed(items, i) {
				outs[i] = heldBack(items[i])
				return true
			}
			return false
		})
		if len(g) == 0 {
			return nil, nil
		}
	}
	fail := func(stage StageName, err error) *storeError {
		for _, i := range g {
			outs[i] = c.storeFailure(items[i].m, stage, err)
		}
		return asStoreError(stage, err)
	}
	all := c.stageOf(items, g)
	sctx, run := c.startStage(ctx, StageBegin, all)
	txn, err := c.store.Begin(sctx)
	c.endStage(sctx, run, err)
	if err != nil {
		return nil, fail(StageBegin, err)
	}
	// From here every path ends the transaction; Rollback after Commit is
	// a no-op by the Txn contract.
	defer txn.Rollback(context.WithoutCancel(ctx))

	// Claims go in id order so that concurrent batches take the unique
	// key's locks in the same order and cannot deadlock each other.
	order := append(sc.order[:0], g...)
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(items[a].m.ID, items[b].m.ID) })
	claims := slices.Grow(sc.claims[:0], len(order))
	for _, i := range order {
		claims = append(claims, driver.Claim{ID: items[i].m.ID, Fingerprint: items[i].fp})
	}
	sc.order, sc.claims = order, claims
	sctx, run = c.startStage(ctx, StageClaim, all)
	sorted, err := txn.Claim(sctx, c.cfg.name, claims)
	if err == nil && len(sorted) != len(claims) {
		err = fmt.Errorf("store returned %d claim results for %d claims", len(sorted), len(claims))
	}
	c.endStage(sctx, run, err)
	if err != nil {
		return nil, fail(StageClaim, err)
	}
	result := slices.Grow(sc.result[:0], len(items))[:len(items)] // by index into items
	sc.result = result
	for k, i := range order {
		result[i] = sorted[k]
	}
	won := make([]int, 0, len(g))
	for _, i := range g { // handlers run in arrival order
		switch r := result[i]; r {
		case driver.ClaimWon:
			won = append(won, i)
		case driver.ClaimDuplicate:
			outs[i] = Outcome{Decision: Duplicate}
		case driver.ClaimMismatch:
			outs[i] = c.mismatchOutcome(items[i].m)
		default:
			outs[i] = c.storeFailure(items[i].m, StageClaim, fmt.Errorf("unknown claim result %d", r))
		}
	}
	if len(won) > 0 {
		won, err = c.kind.fence(ctx, txn, items, won, outs)
		if err != nil {
			return nil, fail(StageFence, err)
		}
	}
	if len(won) == 0 {
		return nil, nil
	}

	applying := c.stageOf(items, won)
	hctx, run := c.startStage(ctx, StageHandlers, applying)
	res := c.kind.apply(ctx, hctx, txn, items, won, outs)
	c.endStage(hctx, run, res.stageErr)
	if res.end {
		return res.rerun, res.trouble
	}
	if res.broken != nil {
		c.undoProcessed(items, won, outs, StageSavepoint, res.broken)
		return nil, asStoreError(StageSavepoint, res.broken)
	}
	if res.applied == 0 {
		return nil, c.handlerTrouble(items, won, outs) // the deferred Rollback undoes everything
	}
	fc, together := txn.(driver.FlushCommitter)
	if f, ok := txn.(driver.Flusher); ok && !together {
		// Statements the handlers queued go now, in one round trip.
		sctx, run := c.startStage(ctx, StageFlush, applying)
		ferr := f.Flush(sctx)
		c.endStage(sctx, run, ferr)
		if ferr != nil {
			return c.failedTogether(items, won, outs, ferr), asHandlerError(ferr)
		}
	}
	sctx, run = c.startStage(ctx, StageCommit, applying)
	if together {
		// The queued statements travel with the COMMIT.
		err = fc.FlushCommit(sctx)
	} else {
		err = txn.Commit(sctx)
	}
	c.endStage(sctx, run, err)
	if fe := (*driver.FlushError)(nil); errors.As(err, &fe) {
		return c.failedTogether(items, won, outs, fe.Err), asHandlerError(fe.Err)
	}
	if err != nil {
		// If the commit did land after all, the redelivery loses its
		// claim and is acknowledged as a Duplicate: retrying is safe.
		c.undoProcessed(items, won, outs, StageCommit, err)
		return nil, asStoreError(StageCommit, err)
	}
	return nil, nil
}

// applyResult is what a kind's apply reports to runTxn.
type applyResult struct {
	// applied counts the messages whose handler succeeded.
	applied int
	// broken is a failed savepoint step: the transaction can no longer be
	// trusted.
	broken error
	// stageErr is what the StageHandlers stage reports to observers.
	stageErr error
	// end means the transaction decides nothing more: runTxn returns rerun
	// (groups to decide again in new transactions) and trouble (a handler
	// failure to check the store against).
	end     bool
	rerun   [][]int
	trouble *storeError
}

// applyBatch runs a BatchHandler's call once for the won claims: nil →
// all Processed; an error is pinned on one message by deciding each alone.
func (c *Consumer[Tx]) applyBatch(hctx context.Context, items []*item, won []int, outs []Outcome, call HandlerCall) applyResult {
	msgs := make([]*Message, len(won))
	for k, i := range won {
		msgs[k] = items[i].m
	}
	if herr := chain(c.cfg.handlerMW, call)(hctx, msgs); herr != nil {
		return applyResult{stageErr: herr, end: true, rerun: c.failedTogether(items, won, outs, herr), trouble: asHandlerError(herr)}
	}
	for _, i := range won {
		outs[i] = Outcome{Decision: Processed}
	}
	return applyResult{applied: len(won)}
}

// applyEach runs call, under the handler middleware, for each claim won,
// one message at a time in arrival order. Under IsolateSavepoints each runs
// under a savepoint, and a failure rolls back to it and deletes the claim;
// under IsolateReplay the first failure ends the transaction and the
// others are returned to run again without it.
func (c *Consumer[Tx]) applyEach(ctx context.Context, txn driver.Txn[Tx], items []*item, won []int, outs []Outcome, call func(ctx context.Context, tx Tx, it *item) error) (res applyResult) {
	var cur *item // the item whose call runs
	handler := chain(c.cfg.handlerMW, func(hctx context.Context, _ []*Message) error {
		return call(hctx, txn.Tx(), cur)
	})
	one := make([]*Message, 1) // handed to each call in turn: valid only during it
	sp, hasSavepoints := txn.(driver.Savepointer)
	useSavepoints := len(won) > 1 && c.cfg.isolation == IsolateSavepoints && hasSavepoints
	if len(won) > 1 && c.cfg.isolation == IsolateSavepoints && !hasSavepoints {
		c.noSavepoints.Do(func() {
			c.log.Warn("idemq: IsolateSavepoints asked for, but the store's transactions have no savepoints: failed batches are replayed (IsolateReplay)")
		})
	}
	for k, i := range won {
		it := items[i]
		if res.broken != nil {
			outs[i] = c.storeFailure(it.m, StageSavepoint, res.broken)
			continue
		}
		if c.keyFailed(items, i) {
			// An earlier message of its key failed under its savepoint:
			// this one goes back behind it, unapplied and unclaimed.
			outs[i] = heldBack(it)
			if err := txn.Unclaim(ctx, c.cfg.name, []string{it.m.ID}); err != nil {
				res.broken = err
			}
			continue
		}
		if useSavepoints {
			if err := sp.Savepoint(ctx); err != nil {
				res.broken = err
				outs[i] = c.storeFailure(it.m, StageSavepoint, err)
				continue
			}
		}
		one[0], cur = it.m, it
		hctx := it.ctx
		switch {
		case c.cfg.txnTimeout <= 0:
		case it.ctx == c.procCtx:
			// No observer added values: the transaction's context, which
			// derives from procCtx, is the handler's as it is.
			hctx = ctx
		default:
			hctx = txnContext{Context: ctx, values: it.ctx}
		}
		herr := handler(hctx, one)
		if herr == nil && useSavepoints {
			// Queued statements must run inside the message's savepoint
			// for a failure to be pinned on it.
			if f, ok := txn.(driver.Flusher); ok {
				herr = f.Flush(ctx)
			}
		}
		if herr == nil {
			if useSavepoints {
				if err := sp.ReleaseSavepoint(ctx); err != nil {
					res.broken = err
					outs[i] = c.storeFailure(it.m, StageSavepoint, err)
					continue
				}
			}
			outs[i] = Outcome{Decision: Processed}
			res.applied++
			continue
		}
		outs[i] = c.handlerFailure(it.m, herr)
		c.failKey(items, i, outs[i])
		if len(won) > 1 && !useSavepoints {
			// Replay: everything else in this transaction runs again,
			// in a new one, without the failed message.
			rest := make([]int, 0, len(won)-1)
			rest = append(rest, won[:k]...)
			rest = append(rest, won[k+1:]...)
			return applyResult{end: true, rerun: [][]int{rest}, trouble: c.handlerTrouble(items, won, outs)}
		}
		if useSavepoints {
			// The failed handler's effects and its claim go together.
			if err := sp.RollbackToSavepoint(ctx); err != nil {
				res.broken = err
				continue
			}
			if err := txn.Unclaim(ctx, c.cfg.name, []string{it.m.ID}); err != nil {
				res.broken = err
			}
		}
	}
	res.stageErr = res.broken
	return res
}

// storeFailure decides a message whose transaction failed outside its
// handler: Retry, without counting towards MaxAttempts.
func (c *Consumer[Tx]) storeFailure(m *Message, stage StageName, err error) Outcome {
	if c.procCtx.Err() != nil {
		return Outcome{Decision: Retry, Err: &DecisionError{MessageID: m.ID, Stage: stage, Err: fmt.Errorf("%w: %v", ErrShutdown, err)}}
	}
	derr := &DecisionError{MessageID: m.ID, Stage: stage, Err: err}
	if IsPermanent(err) {
		return Outcome{Decision: DeadLetter, Err: derr}
	}
	return Outcome{Decision: Retry, Err: derr, Delay: c.cfg.backoff.Delay(m.Attempt)}
}

// handlerFailure decides a message whose handler returned err.
func (c *Consumer[Tx]) handlerFailure(m *Message, err error) Outcome {
	return c.userFailure(m, StageHandler, err)
}

// userFailure decides a message whose user code (its handler, or a leased
// Consumer's External step) failed at stage with err: DeadLetter when err
// is permanent or the attempts are used up, Retry otherwise.
func (c *Consumer[Tx]) userFailure(m *Message, stage StageName, err error) Outcome {
	if c.procCtx.Err() != nil && !IsPermanent(err) {
		return Outcome{Decision: Retry, Err: &DecisionError{MessageID: m.ID, Stage: stage, Err: fmt.Errorf("%w: %v", ErrShutdown, err)}}
	}
	if IsPermanent(err) {
		return Outcome{Decision: DeadLetter, Err: &DecisionError{MessageID: m.ID, Stage: stage, Err: err}}
	}
	if m.Attempt >= c.cfg.maxAttempts {
		return Outcome{Decision: DeadLetter, Err: &DecisionError{MessageID: m.ID, Stage: stage,
			Err: fmt.Errorf("%w (%d of %d): %w", ErrMaxAttempts, m.Attempt, c.cfg.maxAttempts, err)}}
	}
	return Outcome{Decision: Retry, Err: &DecisionError{MessageID: m.ID, Stage: stage, Err: err}, Delay: c.cfg.backoff.Delay(m.Attempt)}
}

func (c *Consumer[Tx]) mismatchOutcome(m *Message) Outcome {
	if c.cfg.mismatch == Duplicate {
		return Outcome{Decision: Duplicate, Err: &DecisionError{MessageID: m.ID, Stage: StageFingerprint, Err: ErrFingerprintMismatch}}
	}
	return Outcome{Decision: DeadLetter, Err: &DecisionError{MessageID: m.ID, Stage: StageFingerprint, Err: ErrFingerprintMismatch}}
}

// followerOutcome decides a message whose id already appeared earlier in
// the same batch, from that earlier message's outcome.
func (c *Consumer[Tx]) followerOutcome(primary *item, pout Outcome, f *item) Outcome {
	sameBody := primary.fp == "" || f.fp == "" || primary.fp == f.fp
	switch {
	case (pout.Decision == Processed || pout.Decision == Duplicate) && sameBody:
		return Outcome{Decision: Duplicate}
	case pout.Decision == Processed || pout.Decision == Duplicate:
		return c.mismatchOutcome(f.m)
	case sameBody && errors.Is(pout.Err, ErrFingerprintMismatch):
		return pout
	}
	if c.procCtx.Err() != nil {
		return Outcome{Decision: Retry, Err: &DecisionError{MessageID: f.m.ID, Stage: StageBatch, Err: ErrShutdown}}
	}
	// The first copy was not applied; this one gets its own turn later.
	return Outcome{Decision: Retry, Err: &DecisionError{MessageID: f.m.ID, Stage: StageBatch,
		Err: fmt.Errorf("an earlier copy in the same batch was not applied: %w", pout.Err)}, Delay: c.cfg.backoff.Delay(f.m.Attempt)}
}

// failedTogether decides a batch whose handler or flush failed as a whole:
// one message is a handler failure; several are decided again each alone,
// in its own transaction, since the error does not say which one failed.
func (c *Consumer[Tx]) failedTogether(items []*item, won []int, outs []Outcome, err error) (rerun [][]int) {
	if len(won) == 1 {
		outs[won[0]] = c.handlerFailure(items[won[0]].m, err)
		return nil
	}
	for _, i := range won {
		rerun = append(rerun, []int{i})
	}
	return rerun
}

// undoProcessed turns the Processed outcomes among won into store failures
// of stage: their transaction did not commit.
func (c *Consumer[Tx]) undoProcessed(items []*item, won []int, outs []Outcome, stage StageName, err error) {
	for _, i := range won {
		if outs[i].Decision == Processed {
			outs[i] = c.storeFailure(items[i].m, stage, err)
		}
	}
}
