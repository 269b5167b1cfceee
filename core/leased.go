package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/core/driver/retry"

	"github.com/idemq/idemq/core/driver"
)

// LeasedHandler is the two steps of a message whose effect is a slow call
// outside the database (a card charge through a payment API), for
// NewLeased.
//
// External makes the call, outside any database transaction, while the
// message's claim is held in progress under a lease. It may run more than
// once for a message (after a crash, a lease taken over, a transient
// error), so it must send an idempotency key that is the same on every
// run: effects.Keyer.ForMessage(ctx, m, "charge") derives it from the
// consumer, the message id and the purpose, and effects.Transport sends it.
// Its error decides as a Handler's does: Permanent → DeadLetter, anything
// else → Retry (DeadLetter after MaxAttempts); either way the lease is
// released first.
//
// Complete applies the local effect with External's result inside the
// completion transaction, which also records the claim as done; it runs
// only while the message's lease is still this consumer's.
type LeasedHandler[Tx, R any] struct {
	// External makes the external call and returns its result. Required.
	External func(ctx context.Context, m *Message) (R, error)
	// Complete applies the local effect with External's result in the
	// completion transaction tx. Required.
	Complete func(ctx context.Context, tx Tx, m *Message, result R) error
	// Lease is how long a claim in progress stays this consumer's without
	// a renewal. The Consumer renews it every third of that while External
	// runs and until the completion commits; a consumer that crashed or
	// hangs loses it after Lease, and the next delivery of the message
	// takes it over. Default 30s.
	Lease time.Duration
	// MaxLease bounds one External call: its context is cancelled after
	// MaxLease, the lease is released and the message retried, so a hung
	// provider holds a message no longer; a call that ignores its context
	// is no longer renewed and loses its lease to the next delivery. Keep
	// it under the broker's own cap on an unsettled delivery (RabbitMQ's
	// consumer_timeout, 30m by default; the SQS and NATS adapters'
	// max_extension, 1h). Default 10m.
	MaxLease time.Duration
}

// Default lease settings of a LeasedHandler.
const (
	DefaultLease    = 30 * time.Second
	DefaultMaxLease = 10 * time.Minute
)

var (
	// ErrLeaseBusy: another consumer holds the message's claim in progress
	// and its lease is live; the message is redelivered later and then
	// decided Duplicate once that consumer completed it.
	ErrLeaseBusy = errors.New("the message's claim is in progress under another consumer's lease")
	// ErrLeaseLost: the lease expired and another consumer took it over
	// before this one completed; this one completes nothing, and the
	// redelivery is decided by the claim the other commits.
	ErrLeaseLost = errors.New("the lease was taken over by another consumer")
)

// NewLeased builds a Consumer whose messages are decided in steps, so a
// slow external effect holds no database transaction or connection: a
// short transaction claims the message's id in progress under a lease
// with a fencing token; h.External runs outside any transaction while the
// lease is renewed (the broker's own lease is kept by the adapter for
// every unsettled delivery); then one transaction runs h.Complete, records
// the claim as done if the token still holds the lease, and commits; then
// the message is acknowledged. A copy that arrives while the lease is live
// is retried later, never applied; after the completion it is a Duplicate.
//
// The store must implement driver.Leaser and its transactions
// driver.Fencer (the Postgres, MySQL/MariaDB and SQLite stores do). Options
// as for New; WithBatchSize and WithConcurrency apply to the completion
// transactions, and the window (WithWindow) bounds the External calls in
// flight. Handler middleware (WithHandlerMiddleware) wraps Complete, inside
// the completion transaction; external middleware (WithExternalMiddleware)
// wraps External.
//
// Run every consumer of one WithName the same way, leased or not: a
// Consumer built by New or NewBatch claims ids without looking at leases,
// so under a name that a leased Consumer also uses it could apply a
// message whose External call is in progress.
func NewLeased[Tx, R any](src driver.Source, store driver.Store[Tx], h LeasedHandler[Tx, R], opts ...Option) (*Consumer[Tx], error) {
	if h.External == nil || h.Complete == nil {
		return nil, errors.New("idemq: NewLeased: LeasedHandler.External and Complete are required")
	}
	if h.Lease < 0 || h.MaxLease < 0 {
		return nil, fmt.Errorf("idemq: NewLeased: Lease %v and MaxLease %v must not be negative", h.Lease, h.MaxLease)
	}
	if h.Lease == 0 {
		h.Lease = DefaultLease
	}
	if h.MaxLease == 0 {
		h.MaxLease = DefaultMaxLease
	}
	if h.Lease < 30*time.Millisecond {
		return nil, fmt.Errorf("idemq: NewLeased: Lease %v is too short to renew (at least 30ms)", h.Lease)
	}
	ls, ok := store.(driver.Leaser)
	if !ok {
		return nil, fmt.Errorf("idemq: NewLeased: the store %T cannot hold leased claims (driver.Leaser)", store)
	}
	return newConsumer("NewLeased", src, store, opts, func(c *Consumer[Tx]) kind[Tx] {
		return &leased[Tx, R]{c: c, h: h, store: ls, held: make(map[*leaseHold]struct{}), complete: func(ctx context.Context, tx Tx, it *item) error {
			r, _ := it.lease.result.(R)
			return h.Complete(ctx, tx, it.m, r)
		}}
	})
}

// leased is NewLeased's kind: a lease and an External call per message
// before its completion transaction.
type leased[Tx, R any] struct {
	c     *Consumer[Tx]
	h     LeasedHandler[Tx, R]
	store driver.Leaser

	// complete is h.Complete for applyEach, made once by NewLeased.
	complete func(ctx context.Context, tx Tx, it *item) error

	mu   sync.Mutex
	held map[*leaseHold]struct{} // renewed until their message is decided
}

// leaseHold is one message's lease, from Acquire to its decision.
type leaseHold struct {
	ref driver.LeaseRef
	// until is when renewals stop (MaxLease after the External call
	// began): a call that ignores its cancelled context loses its lease
	// to the next delivery then, and its fence fails.
	until  time.Time
	result any
	lost   atomic.Bool
	cancel context.CancelFunc // External's context
}

func (l *leased[Tx, R]) hold(h *leaseHold) {
	l.mu.Lock()
	l.held[h] = struct{}{}
	l.mu.Unlock()
}

func (l *leased[Tx, R]) drop(h *leaseHold) {
	l.mu.Lock()
	delete(l.held, h)
	l.mu.Unlock()
}

// background renews every lease held, every third of the lease, until ctx
// ends. A lease found taken over is marked lost and its External call
// cancelled: it could no longer complete.
func (l *leased[Tx, R]) background(ctx context.Context) {
	retry.Every(ctx, l.h.Lease/3, func(time.Time) { l.renew(ctx) })
}

// renew renews every lease held that has not lapsed.
func (l *leased[Tx, R]) renew(ctx context.Context) {
	c := l.c
	l.mu.Lock()
	now := time.Now()
	holds := make([]*leaseHold, 0, len(l.held))
	refs := make([]driver.LeaseRef, 0, len(l.held))
	for h := range l.held {
		if now.After(h.until) {
			continue
		}
		holds = append(holds, h)
		refs = append(refs, h.ref)
	}
	l.mu.Unlock()
	if len(refs) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, l.h.Lease/3)
	still, err := l.store.Renew(rctx, c.cfg.name, refs, l.h.Lease)
	cancel()
	if err == nil && len(still) != len(refs) {
		err = fmt.Errorf("store renewed %d of %d leases", len(still), len(refs))
	}
	if err != nil {
		// The next tick tries again; a lease that expires meanwhile is
		// only taken over if its message is redelivered elsewhere, and
		// then the fence stops this consumer from completing it.
		c.log.Warn("idemq: renewing leases failed", "leases", len(refs), "err", err)
		return
	}
	for i, ok := range still {
		if !ok && holds[i].lost.CompareAndSwap(false, true) {
			holds[i].cancel()
			c.log.Warn("idemq: a lease was taken over while its external step ran", "id", shortID(refs[i].ID))
		}
	}
}

// admit takes one admitted message through the lease and its External
// call, then queues it for a completion transaction, or decides it. The
// External call may take long: each message in flight runs its own steps,
// in a goroutine of its own, up to the window.
func (l *leased[Tx, R]) admit(it *item) { go l.run(it) }

// inOrder is false: each message's External call runs on its own.
func (l *leased[Tx, R]) inOrder() bool { return false }

func (l *leased[Tx, R]) run(it *item) {
	c := l.c
	out, ok := l.acquire(it)
	if !ok {
		c.settleAsync([]settlement{{it: it, out: out}})
		return
	}
	h := it.lease
	ectx, cancel := context.WithTimeout(it.ctx, l.h.MaxLease)
	h.cancel, h.until = cancel, time.Now().Add(l.h.MaxLease)
	l.hold(h)
	external := chain(c.cfg.externalMW, func(ctx context.Context, m *Message) error {
		r, err := l.h.External(ctx, m)
		h.result = r
		return err
	})
	sctx, run := c.startStage(ectx, StageExternal, l.stageOf(it))
	err := external(sctx, it.m)
	c.endStage(sctx, run, err)
	cancel()
	switch {
	case h.lost.Load():
		l.drop(h)
		out = c.storeFailure(it.m, StageLease, ErrLeaseLost)
	case err != nil:
		l.drop(h)
		if errors.Is(err, context.DeadlineExceeded) && ectx.Err() != nil && c.procCtx.Err() == nil {
			err = fmt.Errorf("the external step ran past MaxLease %v: %w", l.h.MaxLease, err)
		}
		l.release(it)
		out = c.userFailure(it.m, StageExternal, err)
	default:
		c.items <- it // capacity window: never blocks
		return
	}
	c.settleAsync([]settlement{{it: it, out: out}})
}

// apply runs Complete, under the handler middleware, for each message whose
// lease held, in the completion transaction.
func (l *leased[Tx, R]) apply(ctx, _ context.Context, txn driver.Txn[Tx], items []*item, won []int, outs []Outcome) applyResult {
	return l.c.applyEach(ctx, txn, items, won, outs, l.complete)
}

// acquireLease claims it's id in progress. ok means the lease is won and
// it.lease set; otherwise out decides the message. A copy that finds the
// id's lease live waits here, asking again, until the holder completed
// (Duplicate) or its lease expired (taken over), for up to one lease: a
// Retry instead would spend one of the broker's deliveries, and a delivery
// limit, on every look.
func (l *leased[Tx, R]) acquire(it *item) (out Outcome, ok bool) {
	c := l.c
	waitUntil := time.Now().Add(l.h.Lease)
	poll := 50 * time.Millisecond
	for {
		lease, failed := l.tryAcquire(it)
		if failed != nil {
			return *failed, false
		}
		switch lease.Result {
		case driver.LeaseWon:
			it.lease = &leaseHold{ref: driver.LeaseRef{ID: it.m.ID, Token: lease.Token}}
			return Outcome{}, true
		case driver.LeaseDone:
			return Outcome{Decision: Duplicate}, false
		case driver.LeaseMismatch:
			return c.mismatchOutcome(it.m), false
		case driver.LeaseBusy:
		default:
			return c.storeFailure(it.m, StageLease, fmt.Errorf("unknown lease result %d", lease.Result)), false
		}
		// Ask again when the lease would expire, or sooner: the holder
		// may complete any moment.
		wait := min(poll, max(time.Until(lease.Until)+5*time.Millisecond, time.Millisecond))
		poll = min(2*poll, time.Second)
		if time.Now().Add(wait).After(waitUntil) {
			// Never dead-lettered for waiting: the holder completes or
			// its lease expires, and either ends the wait.
			return Outcome{Decision: Retry, Err: &DecisionError{MessageID: it.m.ID, Stage: StageLease, Err: ErrLeaseBusy},
				Delay: min(c.cfg.backoff.Delay(it.m.Attempt), max(time.Until(lease.Until), 0))}, false
		}
		if !retry.Sleep(c.stopping, wait) || c.procCtx.Err() != nil {
			return Outcome{Decision: Retry, Err: &DecisionError{MessageID: it.m.ID, Stage: StageLease, Err: fmt.Errorf("%w: %v", ErrShutdown, ErrLeaseBusy)}}, false
		}
	}
}

// tryAcquire asks the store for it's lease once, or, while the store does
// not answer, as often as the Consumer's outage handling runs it again. A
// non-nil outcome decides the message.
func (l *leased[Tx, R]) tryAcquire(it *item) (driver.Lease, *Outcome) {
	c := l.c
	for reruns := 0; ; {
		sctx, run := c.startStage(it.ctx, StageLease, l.stageOf(it))
		lease, err := l.store.Acquire(sctx, c.cfg.name, driver.Claim{ID: it.m.ID, Fingerprint: it.fp}, l.h.Lease)
		c.endStage(sctx, run, err)
		if err == nil {
			return lease, nil
		}
		// As for a batch's transaction: an outage pauses the Consumer
		// instead of spending a delivery on every message in flight.
		serr := asStoreError(StageLease, err)
		if serr == nil || c.procCtx.Err() != nil {
			out := c.storeFailure(it.m, StageLease, err)
			return lease, &out
		}
		again, stopping := c.awaitStore(serr, &reruns)
		if stopping {
			return lease, &Outcome{Decision: Retry, Err: &DecisionError{MessageID: it.m.ID, Stage: StageLease,
				Err: fmt.Errorf("%w: the store did not answer: %v", ErrShutdown, err)}}
		}
		if !again {
			out := c.storeFailure(it.m, StageLease, err)
			return lease, &out
		}
		c.stats.storeRetries.Add(1)
	}
}

// release gives up it's lease, so the message's next delivery takes
// it at once instead of waiting for it to expire. A failure only delays
// that delivery.
func (l *leased[Tx, R]) release(it *item) {
	c := l.c
	ctx, cancel := context.WithTimeout(context.WithoutCancel(it.ctx), c.cfg.settleTimeout)
	defer cancel()
	sctx, run := c.startStage(ctx, StageRelease, l.stageOf(it))
	err := l.store.Release(sctx, c.cfg.name, it.lease.ref)
	c.endStage(sctx, run, err)
	if err != nil {
		c.log.Warn("idemq: releasing a lease failed; the message waits for it to expire", "id", shortID(it.m.ID), "err", err)
	}
}

// fence ends, inside txn, the leases of the won items, and takes out of
// won those whose lease was taken over: their claims are deleted and they
// are decided Retry.
func (l *leased[Tx, R]) fence(ctx context.Context, txn driver.Txn[Tx], items []*item, won []int, outs []Outcome) (_ []int, err error) {
	c := l.c
	ctx, run := c.startStage(ctx, StageFence, c.stageOf(items, won))
	defer func() { c.endStage(ctx, run, err) }()
	f, ok := txn.(driver.Fencer)
	if !ok {
		return nil, fmt.Errorf("the store's transactions (%T) cannot fence leases (driver.Fencer)", txn)
	}
	refs := make([]driver.LeaseRef, len(won))
	for k, i := range won {
		refs[k] = items[i].lease.ref
	}
	held, err := f.Fence(ctx, c.cfg.name, refs)
	if err == nil && len(held) != len(refs) {
		err = fmt.Errorf("store fenced %d of %d leases", len(held), len(refs))
	}
	if err != nil {
		return nil, err
	}
	keep := won[:0:0]
	var lost []string
	for k, i := range won {
		if held[k] {
			keep = append(keep, i)
			continue
		}
		items[i].lease.lost.Store(true)
		outs[i] = c.storeFailure(items[i].m, StageLease, ErrLeaseLost)
		lost = append(lost, items[i].m.ID)
	}
	if len(lost) > 0 {
		if err := txn.Unclaim(ctx, c.cfg.name, lost); err != nil {
			return nil, err
		}
	}
	return keep, nil
}

// decided stops renewing the leases of a decided batch, and releases
// those of messages that were not completed and whose lease is still
// theirs, so their redeliveries need not wait for it to expire.
func (l *leased[Tx, R]) decided(items []*item, outs []Outcome) {
	for i, it := range items {
		if it.lease == nil {
			continue
		}
		l.drop(it.lease)
		if d := outs[i].Decision; d != Processed && d != Duplicate && !it.lease.lost.Load() {
			l.release(it)
		}
	}
}

// stageOf is the Stage of one message's own stages.
func (l *leased[Tx, R]) stageOf(it *item) Stage {
	return l.c.stageOf([]*item{it}, []int{0})
}
