package memory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// Delivery is one received message: a lease on it until the visibility
// timeout. It implements driver.Delivery. Exactly one settlement (Ack, Retry,
// DeadLetter, or an AckBatch including it) succeeds; see the package
// documentation for what a late or repeated settlement returns.
type Delivery struct {
	sub *Subscription
	e   *entry
	seq uint64
	msg driver.Message

	settled driver.SettleOnce // the consumer called a settlement (its window slot is free)

	// guarded by the queue's mutex
	lease hnode // the lease deadline
}

var _ driver.Delivery = (*Delivery)(nil)

func (d *Delivery) node() *hnode { return &d.lease }

// Message returns the delivered message. It is the delivery's own copy:
// changing it (an IDFunc setting ID) changes no other delivery.
func (d *Delivery) Message() *driver.Message { return &d.msg }

// lockForSettle locks the queue and checks that d can be settled. On
// success the queue stays locked and the caller must unlock it.
func (d *Delivery) lockForSettle(ctx context.Context) (*queue, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := d.sub.q
	q.mu.Lock()
	if err := d.sub.errLocked(); err != nil {
		q.mu.Unlock()
		return nil, driver.Stale(err)
	}
	if d.settled.Settled() {
		q.mu.Unlock()
		return nil, driver.ErrAlreadySettled
	}
	return q, nil
}

// markSettledLocked records the consumer's settlement and reports whether
// the lease is still current; a stale one is counted and refused.
func (d *Delivery) markSettledLocked() error {
	_ = d.settled.Claim() // under the queue's lock, after lockForSettle checked it
	d.sub.releaseSlotLocked()
	if !d.live() {
		d.sub.q.stats.StaleSettlements++
		return ErrLeaseExpired
	}
	return nil
}

// Ack removes the message from the queue. With the LoseAck fault it returns
// nil but the broker keeps the lease, and the message is redelivered after
// the visibility timeout; with the CrashOnAck fault the subscription
// crashes instead and Ack returns ErrCrashed. A done ctx returns its error
// and settles nothing.
func (d *Delivery) Ack(ctx context.Context) error {
	f := d.sub.q.b.currentFaults()
	q, err := d.lockForSettle(ctx)
	if err != nil {
		return err
	}
	defer q.mu.Unlock()
	if d.live() && f.CrashOnAck > 0 && q.ackRng.Float64() < f.CrashOnAck {
		d.sub.shutdownLocked(subCrashed)
		return ErrCrashed
	}
	if err := d.markSettledLocked(); err != nil {
		return err
	}
	if f.LoseAck > 0 && q.ackRng.Float64() < f.LoseAck {
		q.stats.AcksLost++
		return nil
	}
	q.ackLocked(d)
	return nil
}

func (q *queue) ackLocked(d *Delivery) {
	q.endLeaseLocked(d)
	d.e.state = stateDone
	q.stats.Acked++
	q.checkIdleLocked()
}

// Retry makes the message ready again after delay (at once when delay <= 0);
// its next delivery has the next attempt number.
func (d *Delivery) Retry(ctx context.Context, delay time.Duration) error {
	return d.settleWith(ctx, func(q *queue) {
		q.retryLocked(d, delay)
	})
}

func (q *queue) retryLocked(d *Delivery, delay time.Duration) {
	q.endLeaseLocked(d)
	q.stats.Retried++
	e := d.e
	if delay <= 0 {
		q.makeReadyLocked(e, false)
	} else {
		e.state = stateDelayed
		e.delay.at = time.Now().Add(delay)
		q.delayed.push(e)
		q.armLocked()
	}
}

// settleWith settles d by running apply on its queue, locked, once the
// settlement is allowed (not settled before, lease still current).
func (d *Delivery) settleWith(ctx context.Context, apply func(q *queue)) error {
	q, err := d.lockForSettle(ctx)
	if err != nil {
		return err
	}
	defer q.mu.Unlock()
	if err := d.markSettledLocked(); err != nil {
		return err
	}
	apply(q)
	return nil
}

// errNoCause stands in for a nil cause so that a dead letter always says
// why.
var errNoCause = errors.New("memory: dead-lettered without a cause")

// DeadLetter parks the message with cause (see Broker.DeadLetters and
// Broker.Redrive). A nil cause is recorded as an error saying none was
// given.
func (d *Delivery) DeadLetter(ctx context.Context, cause error) error {
	if cause == nil {
		cause = errNoCause
	}
	return d.settleWith(ctx, func(q *queue) {
		q.endLeaseLocked(d)
		d.e.state = stateDead
		q.dead = append(q.dead, DeadLetter{Message: cloneMessage(d.msg), Cause: cause, At: time.Now(), entry: d.e})
		q.stats.DeadLettered++
		q.checkIdleLocked()
	})
}

// ExtendVisibility moves the lease deadline to d from now, as SQS
// ChangeMessageVisibility does for a heartbeat during long work. It returns
// ErrLeaseExpired when the lease already ended and driver.ErrAlreadySettled after
// a settlement.
func (d *Delivery) ExtendVisibility(ctx context.Context, timeout time.Duration) error {
	if timeout <= 0 {
		return fmt.Errorf("memory: ExtendVisibility: timeout must be positive, got %v", timeout)
	}
	q, err := d.lockForSettle(ctx)
	if err != nil {
		return err
	}
	defer q.mu.Unlock()
	if !d.live() {
		return ErrLeaseExpired
	}
	d.lease.at = time.Now().Add(timeout)
	q.leases.fix(d)
	q.armLocked() // a shorter timeout may be earlier than the timer
	return nil
}
