package memory

import (
	"context"
	"errors"
	"fmt"

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

type subConfig struct {
	window int // 0: unlimited
}

// SubscribeOption configures a Subscription.
type SubscribeOption func(*subConfig) error

// WithWindow caps how many deliveries the subscription holds unsettled, like
// AMQP prefetch: Receive blocks while the window is full. Must be at least
// 1. Default: unlimited until SetWindow is called (the Consumer calls it
// with its own window before the first Receive).
func WithWindow(n int) SubscribeOption {
	return func(c *subConfig) error {
		if n < 1 {
			return fmt.Errorf("memory: Window must be at least 1, got %d", n)
		}
		c.window = n
		return nil
	}
}

type subState uint8

const (
	subOpen subState = iota
	subClosed
	subCrashed
	subBrokerClosed
)

// Subscription receives from one queue. It implements driver.Source,
// driver.BatchSettler and driver.WindowSetter. Its methods are safe for
// concurrent use, and Receive may be called from several goroutines.
type Subscription struct {
	q    *queue
	id   uint64
	done chan struct{} // closed when the subscription closes or crashes

	// guarded by q.mu
	state         subState
	window        int // 0: unlimited
	held          int // deliveries the consumer has not settled yet
	leases        map[*Delivery]struct{}
	windowWaiters []*waiter
}

var (
	_ driver.Source       = (*Subscription)(nil)
	_ driver.BatchSettler = (*Subscription)(nil)
	_ driver.WindowSetter = (*Subscription)(nil)
)

func (q *queue) subscribe(sc subConfig) (*Subscription, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, ErrBrokerClosed
	}
	q.subSeq++
	s := &Subscription{q: q, id: q.subSeq, done: make(chan struct{}), window: sc.window, leases: map[*Delivery]struct{}{}}
	if q.subs == nil {
		q.subs = map[*Subscription]struct{}{}
	}
	q.subs[s] = struct{}{}
	return s, nil
}

// Queue returns the name of the queue the subscription receives from.
func (s *Subscription) Queue() string { return s.q.name }

func (s *Subscription) errLocked() error {
	switch s.state {
	case subClosed:
		return ErrSubscriptionClosed
	case subCrashed:
		return ErrCrashed
	case subBrokerClosed:
		return ErrBrokerClosed
	}
	return nil
}

func (s *Subscription) roomLocked() bool { return s.window == 0 || s.held < s.window }

// releaseSlotLocked frees the window slot of one settled delivery.
func (s *Subscription) releaseSlotLocked() {
	s.held--
	if len(s.windowWaiters) > 0 && s.roomLocked() {
		s.wakeWindowLocked(1)
	}
}

func (s *Subscription) wakeWindowLocked(n int) { wake(&s.windowWaiters, n) }

// Receive returns the next ready message of the queue, blocking while none
// is ready or the window is full. It returns ctx.Err() when ctx is done, and
// an error wrapping driver.ErrSourceClosed once the subscription is closed
// (ErrSubscriptionClosed), crashed (ErrCrashed) or the broker closed
// (ErrBrokerClosed). Blocked receivers are woken one per ready message, in
// the order they started waiting.
func (s *Subscription) Receive(ctx context.Context) (driver.Delivery, error) {
	q := s.q
	var w *waiter
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		q.mu.Lock()
		if w != nil {
			q.removeWaiterLocked(s, w)
		}
		if err := s.errLocked(); err != nil {
			q.mu.Unlock()
			return nil, err
		}
		if s.roomLocked() {
			if e, ok := q.ready.popFront(); ok {
				d := q.deliverLocked(s, e)
				q.mu.Unlock()
				return d, nil
			}
		}
		if w == nil {
			w = &waiter{ch: make(chan struct{}, 1)}
		}
		select { // drop a stale wake-up
		case <-w.ch:
		default:
		}
		if s.roomLocked() {
			w.where = waitQueue
			q.waiters = append(q.waiters, w)
		} else {
			w.where = waitWindow
			s.windowWaiters = append(s.windowWaiters, w)
			// We may have been woken for a ready message we cannot
			// take: pass it on to another receiver.
			if q.ready.len() > 0 {
				q.wakeLocked(1)
			}
		}
		q.mu.Unlock()
		select {
		case <-w.ch:
		case <-s.done:
		case <-ctx.Done():
			q.mu.Lock()
			if w.where == waitNone {
				// We were woken and will not use it: pass it on.
				if q.ready.len() > 0 {
					q.wakeLocked(1)
				}
				if s.roomLocked() {
					s.wakeWindowLocked(1)
				}
			}
			q.removeWaiterLocked(s, w)
			q.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

// SetWindow sets the subscription's window (see WithWindow): at most n
// deliveries held unsettled. It may be changed at any time; a smaller
// window takes effect as deliveries are settled, a larger one wakes blocked
// receivers. It returns an error naming the field when n is below 1.
func (s *Subscription) SetWindow(n int) error {
	if n < 1 {
		return fmt.Errorf("memory: Window must be at least 1, got %d", n)
	}
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	s.window = n
	s.wakeWindowLocked(len(s.windowWaiters))
	return nil
}

// AckBatch acknowledges several deliveries of this subscription at once, as
// an AMQP multiple ack or SQS DeleteMessageBatch does. Faults are drawn per
// delivery, at the same rates as for Ack, so a run injects about as many
// faults whatever the batch size: if any delivery draws CrashOnAck the
// subscription crashes before acknowledging anything (the process died
// before sending the batch) and AckBatch returns ErrCrashed; each delivery
// that draws LoseAck is reported acknowledged but stays leased. Otherwise
// each delivery is settled on its own, and the returned error joins the
// failures of those that could not be (driver.ErrAlreadySettled,
// ErrLeaseExpired),
// each naming its index. A delivery from another subscription fails the
// whole call before anything is settled.
func (s *Subscription) AckBatch(ctx context.Context, ds []driver.Delivery) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f := s.q.b.currentFaults()
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := s.errLocked(); err != nil {
		return driver.Stale(err)
	}
	own := make([]*Delivery, len(ds))
	for i, cd := range ds {
		d, ok := cd.(*Delivery)
		if !ok || d == nil || d.sub != s {
			return fmt.Errorf("memory: AckBatch: ds[%d]: %w", i, ErrForeignDelivery)
		}
		own[i] = d
	}
	if f.CrashOnAck > 0 {
		for _, d := range own {
			if !d.settled.Settled() && d.live() && q.ackRng.Float64() < f.CrashOnAck {
				s.shutdownLocked(subCrashed)
				return ErrCrashed
			}
		}
	}
	var errs []error
	for i, d := range own {
		if d.settled.Settled() {
			errs = append(errs, fmt.Errorf("memory: AckBatch: ds[%d]: %w", i, driver.ErrAlreadySettled))
			continue
		}
		if err := d.markSettledLocked(); err != nil {
			errs = append(errs, fmt.Errorf("memory: AckBatch: ds[%d]: %w", i, err))
			continue
		}
		if f.LoseAck > 0 && q.ackRng.Float64() < f.LoseAck {
			q.stats.AcksLost++
			continue
		}
		q.ackLocked(d)
	}
	return errors.Join(errs...)
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
		q.endLeaseLocked(d)
		q.stats.Expired++
		q.makeReadyLocked(d.e, false)
	}
	q.armLocked()
}

// Crash simulates the consumer process dying: every message the
// subscription holds (settled or not on the consumer's side, such as a lost
// ack) goes back to the front of the queue at once and is redelivered with
// the next attempt number; Receive and every later settlement of its
// deliveries return ErrCrashed. Crash after Close or a crash does nothing.
func (s *Subscription) Crash() {
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	s.shutdownLocked(subCrashed)
}

// Close stops the subscription gracefully, like closing an AMQP channel:
// blocked and later Receive calls return ErrSubscriptionClosed, the
// messages it still holds go back to the front of the queue, and later
// settlements of its deliveries return ErrSubscriptionClosed. Settle
// everything you can before Close. Close is idempotent and returns nil.
func (s *Subscription) Close() error {
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	s.shutdownLocked(subClosed)
	return nil
}

func (s *Subscription) shutdownLocked(state subState) {
	if s.state != subOpen {
		return
	}
	q := s.q
	s.state = state
	close(s.done)
	delete(q.subs, s)
	if state == subCrashed {
		q.stats.Crashes++
	}
	if state != subBrokerClosed {
		q.requeueLocked(s)
	}
	s.held = 0
	s.wakeWindowLocked(len(s.windowWaiters))
}
