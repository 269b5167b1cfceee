package memory

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// Metadata keys set on every delivered message.
const (
	// MetaDeliverySeq is the queue-wide delivery sequence number: every
	// delivery, redeliveries included, gets the next one.
	MetaDeliverySeq = "idemq.memory.delivery_seq"
	// MetaPublishSeq is the queue-wide sequence number of the enqueued copy;
	// it stays the same across redeliveries, and a duplicate publish gets
	// its own.
	MetaPublishSeq = "idemq.memory.publish_seq"
	// MetaSubscriber identifies the subscription that received it, unique
	// per queue.
	MetaSubscriber = "idemq.memory.subscriber"
)

// Subscription receives from one queue: it is a driver.Puller and a
// driver.Releaser, what core.New takes. Its methods are safe for
// concurrent use, and Receive may be called from several goroutines.
type Subscription struct {
	q    *queue
	id   uint64
	done chan struct{} // closed when the subscription closes or crashes

	// guarded by q.mu
	err    error // why it stopped: ErrSubscriptionClosed, ErrCrashed, ErrBrokerClosed
	leases map[*delivery]struct{}
}

var (
	_ driver.Puller   = (*Subscription)(nil)
	_ driver.Releaser = (*Subscription)(nil)
)

// Queue returns the name of the queue the subscription receives from.
func (s *Subscription) Queue() string { return s.q.name }

// Start implements driver.Source: a delivery is leased for the broker's
// visibility timeout (Traits.Lease), never extended, and Retry's delay is
// kept by the broker.
func (s *Subscription) Start(context.Context, driver.Setup) (driver.Traits, error) {
	return driver.Traits{Lease: s.q.b.cfg.visibility, DelaysRetry: true}, nil
}

// Receive implements driver.Puller: it returns up to max ready messages
// of the queue, blocking while none is ready. It returns ctx.Err() when
// ctx is done, and an error wrapping driver.ErrSourceClosed once the
// subscription is closed (ErrSubscriptionClosed), crashed (ErrCrashed) or
// the broker closed (ErrBrokerClosed). Blocked receivers are woken one per
// ready message, in the order they started waiting.
func (s *Subscription) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	if max < 1 {
		max = 1
	}
	q := s.q
	var w chan struct{} // our place among the waiters, once we wait
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		q.mu.Lock()
		if w != nil {
			q.removeWaiterLocked(w)
		}
		if err := s.err; err != nil {
			q.mu.Unlock()
			return nil, err
		}
		if len(q.ready) > 0 {
			ms := make([]*driver.Message, min(max, len(q.ready)))
			for i, e := range q.ready[:len(ms)] {
				ms[i] = &q.deliverLocked(s, e).msg
			}
			clear(q.ready[:len(ms)])
			q.ready = q.ready[len(ms):]
			if len(q.ready) > 0 {
				q.wakeLocked(1) // what is left is another receiver's
			}
			q.mu.Unlock()
			return ms, nil
		}
		if w == nil {
			w = make(chan struct{}, 1)
		}
		select { // drop a stale wake-up
		case <-w:
		default:
		}
		q.waiters = append(q.waiters, w)
		q.mu.Unlock()
		select {
		case <-w:
		case <-s.done:
		case <-ctx.Done():
			q.mu.Lock()
			if !q.removeWaiterLocked(w) && len(q.ready) > 0 {
				q.wakeLocked(1) // we were woken and will not use it: pass it on
			}
			q.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

// Ack implements driver.Source: it acknowledges ms at once, as an AMQP
// multiple ack or SQS DeleteMessageBatch does. Faults are drawn per
// message: if any draws CrashOnAck the subscription crashes before
// acknowledging anything (the process died before sending the batch) and
// Ack returns ErrCrashed; each one that draws LoseAck is reported
// acknowledged but stays leased.
func (s *Subscription) Ack(ctx context.Context, ms []*driver.Message) error {
	f := *s.q.b.faults.Load()
	return s.settle(ctx, ms, func(q *queue, own []*delivery) error {
		for _, d := range own {
			if d != nil && f.CrashOnAck > 0 && q.ackRng.Float64() < f.CrashOnAck {
				s.shutdownLocked(ErrCrashed)
				return ErrCrashed
			}
		}
		for _, d := range own {
			switch {
			case d == nil:
			case f.LoseAck > 0 && q.ackRng.Float64() < f.LoseAck:
				q.stats.AcksLost++
			default:
				q.endLeaseLocked(d)
				q.stats.Acked++
			}
		}
		q.checkIdleLocked()
		return nil
	})
}

// Retry implements driver.Source: each message is ready again after delay
// (at once when delay <= 0), behind those ready now; its next delivery has
// the next attempt number.
func (s *Subscription) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	return s.settle(ctx, ms, func(q *queue, own []*delivery) error {
		for _, d := range own {
			if d == nil {
				continue
			}
			q.endLeaseLocked(d)
			q.stats.Retried++
			if delay <= 0 {
				q.makeReadyLocked(d.e)
				continue
			}
			d.e.delay.at = time.Now().Add(delay)
			heap.Push(&q.delayed, d.e)
		}
		q.armLocked()
		return nil
	})
}

// Release implements driver.Releaser: the messages go back to the front of
// the queue at once, in the order they were delivered, as a closed
// channel's would; their next delivery has the next attempt number.
func (s *Subscription) Release(ctx context.Context, ms []*driver.Message) error {
	return s.settle(ctx, ms, func(q *queue, own []*delivery) error {
		q.requeueLocked(slices.DeleteFunc(own, func(d *delivery) bool { return d == nil }))
		return nil
	})
}

// errNoCause stands in for a nil cause so that a dead letter always says
// why.
var errNoCause = errors.New("memory: dead-lettered without a cause")

// DeadLetter implements driver.Source: it parks each message with its
// cause (see Broker.DeadLetters and Broker.Redrive). A nil cause is
// recorded as an error saying none was given.
func (s *Subscription) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	return s.settle(ctx, ms, func(q *queue, own []*delivery) error {
		for i, d := range own {
			if d == nil {
				continue
			}
			cause := causes[i]
			if cause == nil {
				cause = errNoCause
			}
			q.endLeaseLocked(d)
			q.dead = append(q.dead, DeadLetter{Message: cloneMessage(d.msg), Cause: cause, At: time.Now(), entry: d.e})
			q.stats.DeadLettered++
		}
		q.checkIdleLocked()
		return nil
	})
}

// settle applies a settlement of ms, locked: apply gets the deliveries of
// ms, nil where the lease is no longer current (ErrLeaseExpired, in a
// *driver.Partial), and its error is the call's. A message of another
// subscription, or a subscription gone, fails the whole call.
func (s *Subscription) settle(ctx context.Context, ms []*driver.Message, apply func(q *queue, own []*delivery) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	own := make([]*delivery, len(ms))
	for i, m := range ms {
		d, ok := m.AckID.(*delivery)
		if !ok || d.sub != s {
			return fmt.Errorf("memory: ms[%d]: %w", i, ErrForeignDelivery)
		}
		own[i] = d
	}
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if s.err != nil {
		return driver.Stale(s.err)
	}
	errs := make([]error, len(own))
	for i, d := range own {
		if !d.live() {
			q.stats.StaleSettlements++
			errs[i], own[i] = ErrLeaseExpired, nil
		}
	}
	if err := apply(q, own); err != nil {
		return err
	}
	return driver.PartialOf(errs)
}

// ExpireLeases ends every lease the subscription holds at once, as an
// expired visibility timeout or a lost connection would: the messages are
// ready again (redelivered with the next attempt number) and settling the
// deliveries received before returns ErrLeaseExpired. The subscription
// stays open. It is a fault to inject in tests.
func (s *Subscription) ExpireLeases() {
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	for d := range s.leases {
		q.expireLocked(d)
	}
	q.armLocked()
}

// Crash simulates the consumer process dying: every message the
// subscription holds (settled or not on the consumer's side, such as a lost
// ack) goes back to the front of the queue at once and is redelivered with
// the next attempt number; Receive and every later settlement of its
// deliveries return ErrCrashed. Crash after Close or a crash does nothing.
func (s *Subscription) Crash() {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	s.shutdownLocked(ErrCrashed)
}

// Close stops the subscription gracefully, like closing an AMQP channel:
// blocked and later Receive calls return ErrSubscriptionClosed, the
// messages it still leases go back to the front of the queue, and later
// settlements of its messages return ErrSubscriptionClosed. Close is
// idempotent and returns nil.
func (s *Subscription) Close() error {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	s.shutdownLocked(ErrSubscriptionClosed)
	return nil
}

// shutdownLocked stops s for why (ErrSubscriptionClosed, ErrCrashed or
// ErrBrokerClosed), giving back what it leases unless the broker closed.
func (s *Subscription) shutdownLocked(why error) {
	if s.err != nil {
		return
	}
	q := s.q
	s.err = why
	close(s.done)
	delete(q.subs, s)
	if why == ErrCrashed {
		q.stats.Crashes++
	}
	if why != ErrBrokerClosed {
		q.requeueLocked(slices.Collect(maps.Keys(s.leases)))
	}
}
