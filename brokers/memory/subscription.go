package memory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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

type subState uint8

const (
	subOpen subState = iota
	subClosed
	subCrashed
	subBrokerClosed
)

// Subscription receives from one queue: it is a driver.Puller. Its
// methods are safe for concurrent use, and Receive may be called from
// several goroutines.
type Subscription struct {
	q    *queue
	id   uint64
	done chan struct{} // closed when the subscription closes or crashes

	// guarded by q.mu
	state  subState
	leases map[*delivery]struct{}
}

var (
	_ driver.Puller   = (*Subscription)(nil)
	_ driver.Releaser = (*Subscription)(nil)
)

func (q *queue) subscribe() (*Subscription, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, ErrBrokerClosed
	}
	q.subSeq++
	s := &Subscription{q: q, id: q.subSeq, done: make(chan struct{}), leases: map[*delivery]struct{}{}}
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
	q := s.q
	var w *waiter
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		q.mu.Lock()
		if w != nil {
			q.removeWaiterLocked(w)
		}
		if err := s.errLocked(); err != nil {
			q.mu.Unlock()
			return nil, err
		}
		if q.ready.len() > 0 {
			ms := make([]*driver.Message, 0, min(max, q.ready.len()))
			for len(ms) < max {
				e, ok := q.ready.popFront()
				if !ok {
					break
				}
				ms = append(ms, &q.deliverLocked(s, e).msg)
			}
			if q.ready.len() > 0 && len(q.waiters) > 0 {
				q.wakeLocked(1) // what is left is another receiver's
			}
			q.mu.Unlock()
			return ms, nil
		}
		if w == nil {
			w = &waiter{ch: make(chan struct{}, 1)}
		}
		select { // drop a stale wake-up
		case <-w.ch:
		default:
		}
		w.where = waitQueue
		q.waiters = append(q.waiters, w)
		q.mu.Unlock()
		select {
		case <-w.ch:
		case <-s.done:
		case <-ctx.Done():
			q.mu.Lock()
			if w.where == waitNone && q.ready.len() > 0 {
				q.wakeLocked(1) // we were woken and will not use it: pass it on
			}
			q.removeWaiterLocked(w)
			q.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

// own returns the subscription's deliveries of ms, or ErrForeignDelivery.
func (s *Subscription) own(ms []*driver.Message) ([]*delivery, error) {
	own := make([]*delivery, len(ms))
	for i, m := range ms {
		d, ok := m.AckID.(*delivery)
		if !ok || d.sub != s {
			return nil, fmt.Errorf("memory: ms[%d]: %w", i, ErrForeignDelivery)
		}
		own[i] = d
	}
	return own, nil
}

// Ack implements driver.Source: it acknowledges ms at once, as an AMQP
// multiple ack or SQS DeleteMessageBatch does. Faults are drawn per
// message: if any draws CrashOnAck the subscription crashes before
// acknowledging anything (the process died before sending the batch) and
// Ack returns ErrCrashed; each one that draws LoseAck is reported
// acknowledged but stays leased. A message whose lease expired is refused
// with ErrLeaseExpired (a *driver.Partial says which). A message from
// another subscription fails the whole call before anything is settled.
func (s *Subscription) Ack(ctx context.Context, ms []*driver.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	own, err := s.own(ms)
	if err != nil {
		return err
	}
	f := s.q.b.currentFaults()
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := s.errLocked(); err != nil {
		return driver.Stale(err)
	}
	if f.CrashOnAck > 0 {
		for _, d := range own {
			if d.live() && q.ackRng.Float64() < f.CrashOnAck {
				s.shutdownLocked(subCrashed)
				return ErrCrashed
			}
		}
	}
	errs := make([]error, len(own))
	for i, d := range own {
		if errs[i] = d.checkLiveLocked(); errs[i] != nil {
			continue
		}
		if f.LoseAck > 0 && q.ackRng.Float64() < f.LoseAck {
			q.stats.AcksLost++
			continue
		}
		q.ackLocked(d)
	}
	return driver.PartialOf(errs)
}

// Retry implements driver.Source: each message is ready again after delay
// (at once when delay <= 0), behind those ready now; its next delivery has
// the next attempt number.
func (s *Subscription) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	return s.settle(ctx, ms, func(q *queue, i int, d *delivery) { q.retryLocked(d, delay) })
}

// Release implements driver.Releaser: the messages go back to the front of
// the queue at once, in the order they were delivered, as a closed
// channel's would; their next delivery has the next attempt number.
func (s *Subscription) Release(ctx context.Context, ms []*driver.Message) error {
	var back []*delivery
	err := s.settle(ctx, ms, func(q *queue, i int, d *delivery) { back = append(back, d) })
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	slices.SortFunc(back, func(a, b *delivery) int { return cmp.Compare(a.seq, b.seq) })
	for i := len(back) - 1; i >= 0; i-- {
		if back[i].live() {
			q.endLeaseLocked(back[i])
			q.makeReadyLocked(back[i].e, true)
			q.stats.Requeued++
		}
	}
	return err
}

// errNoCause stands in for a nil cause so that a dead letter always says
// why.
var errNoCause = errors.New("memory: dead-lettered without a cause")

// DeadLetter implements driver.Source: it parks each message with its
// cause (see Broker.DeadLetters and Broker.Redrive). A nil cause is
// recorded as an error saying none was given.
func (s *Subscription) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	return s.settle(ctx, ms, func(q *queue, i int, d *delivery) {
		cause := causes[i]
		if cause == nil {
			cause = errNoCause
		}
		q.endLeaseLocked(d)
		d.e.state = stateDead
		q.dead = append(q.dead, DeadLetter{Message: cloneMessage(d.msg), Cause: cause, At: time.Now(), entry: d.e})
		q.stats.DeadLettered++
		q.checkIdleLocked()
	})
}

// settle runs apply on the queue, locked, for each message of ms whose
// lease is still current.
func (s *Subscription) settle(ctx context.Context, ms []*driver.Message, apply func(q *queue, i int, d *delivery)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	own, err := s.own(ms)
	if err != nil {
		return err
	}
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := s.errLocked(); err != nil {
		return driver.Stale(err)
	}
	errs := make([]error, len(own))
	for i, d := range own {
		if errs[i] = d.checkLiveLocked(); errs[i] == nil {
			apply(q, i, d)
		}
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
// messages it still leases go back to the front of the queue, and later
// settlements of its messages return ErrSubscriptionClosed. Close is
// idempotent and returns nil.
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
}
