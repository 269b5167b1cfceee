package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/option"
)

// System is the value of driver.Message.System for messages of this broker.
const System = "memory"

// DefaultVisibilityTimeout is how long a delivery stays leased to its
// subscription when WithVisibilityTimeout is not given.
const DefaultVisibilityTimeout = 30 * time.Second

// DefaultSeed seeds the fault injection when WithSeed is not given, so runs
// are reproducible by default.
const DefaultSeed uint64 = 1

// Errors returned by the broker; test with errors.Is. ErrCrashed,
// ErrSubscriptionClosed and ErrBrokerClosed wrap driver.ErrSourceClosed,
// so the Consumer stops when Receive returns them; a settlement that gets
// one also wraps driver.ErrStaleDelivery (the message is redelivered).
var (
	// ErrCrashed is returned by Receive and by every settlement of a
	// subscription after it crashed (Subscription.Crash or the CrashOnAck
	// fault).
	ErrCrashed = fmt.Errorf("memory: subscription crashed: %w", driver.ErrSourceClosed)
	// ErrSubscriptionClosed is returned by Receive and by settlements
	// after Subscription.Close.
	ErrSubscriptionClosed = fmt.Errorf("memory: subscription closed: %w", driver.ErrSourceClosed)
	// ErrBrokerClosed is returned by every operation after Broker.Close.
	ErrBrokerClosed = fmt.Errorf("memory: broker closed: %w", driver.ErrSourceClosed)
	// ErrLeaseExpired is returned when a delivery is settled after its
	// lease ended (visibility timeout, Subscription.ExpireLeases, an
	// earlier settlement): the message may have been redelivered, and the
	// settlement is ignored. It wraps driver.ErrStaleDelivery.
	ErrLeaseExpired = driver.Stale(errors.New("memory: delivery lease expired"))
	// ErrForeignDelivery is returned by a settlement of a message that was
	// not received from the same subscription.
	ErrForeignDelivery = errors.New("memory: delivery is not from this subscription")
)

// Faults are probabilities in [0, 1] of injected failures. They are drawn
// from pseudo-random sources seeded by WithSeed: one per queue for
// publishes and one per queue for acks, so the duplicates a sequence of
// publishes gets does not depend on how consumption interleaves.
type Faults struct {
	// LoseAck is the chance, per message of an Ack, that its ack is
	// reported done but never reaches the broker: the message stays leased
	// and is redelivered after the visibility timeout (or at once if the
	// subscription crashes or closes first).
	LoseAck float64
	// CrashOnAck is the chance, per acknowledged delivery, that the
	// subscription crashes instead of acknowledging, as Subscription.Crash
	// does: the consumer committed but died before its ack. The call
	// returns ErrCrashed and everything the subscription held is
	// redelivered.
	CrashOnAck float64
	// DuplicatePublish is the chance that a published message is enqueued
	// twice, as when a producer retries a publish whose confirm was lost.
	DuplicatePublish float64
}

func (f Faults) validate() error {
	names := []string{"LoseAck", "CrashOnAck", "DuplicatePublish"}
	for i, v := range []float64{f.LoseAck, f.CrashOnAck, f.DuplicatePublish} {
		if !(v >= 0 && v <= 1) { // also rejects NaN
			return fmt.Errorf("memory: Faults.%s must be within [0, 1], got %v", names[i], v)
		}
	}
	return nil
}

type config struct {
	seed       uint64
	visibility time.Duration
	faults     Faults
}

// Option configures a Broker.
type Option func(*config) error

// WithSeed seeds the pseudo-random fault injection. Default DefaultSeed (1).
func WithSeed(seed uint64) Option {
	return func(c *config) error { c.seed = seed; return nil }
}

// WithVisibilityTimeout sets how long a delivery is leased to its
// subscription before the broker redelivers it. Must be positive. Default
// DefaultVisibilityTimeout (30s).
func WithVisibilityTimeout(d time.Duration) Option {
	return option.Set("memory", "WithVisibilityTimeout", option.Positive(d), func(c *config) { c.visibility = d })
}

// WithFaults sets the initial fault probabilities (see SetFaults). Default:
// no faults.
func WithFaults(f Faults) Option {
	return option.Check(f.validate(), func(c *config) { c.faults = f })
}

// Broker is an in-process at-least-once broker holding named queues. Queues
// are created on first use. All methods are safe for concurrent use.
type Broker struct {
	cfg  config
	done chan struct{}

	faults atomic.Pointer[Faults] // read on every ack and publish, so no lock

	mu        sync.Mutex
	queues    map[string]*queue
	closed    bool
	closeOnce sync.Once
}

// NewBroker returns a broker with no queues. It returns an error naming the
// field when an option is invalid.
func NewBroker(opts ...Option) (*Broker, error) {
	cfg := config{seed: DefaultSeed, visibility: DefaultVisibilityTimeout}
	if err := option.Apply(&cfg, opts...); err != nil {
		return nil, err
	}
	b := &Broker{cfg: cfg, done: make(chan struct{}), queues: map[string]*queue{}}
	b.faults.Store(&cfg.faults)
	return b, nil
}

// SetFaults changes the fault probabilities for every queue from now on. It
// returns an error naming the field when a probability is outside [0, 1].
func (b *Broker) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	b.faults.Store(&f)
	return nil
}

// queue returns the named queue, creating it when create is set; nil when
// it does not exist. Only creating fails after Close, so Stats and
// DeadLetters still answer then.
func (b *Broker) queue(name string, create bool) (*queue, error) {
	if name == "" {
		return nil, errors.New("memory: queue name must not be empty")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed && create {
		return nil, ErrBrokerClosed
	}
	q := b.queues[name]
	if q == nil && create {
		h := fnv.New64a()
		h.Write([]byte(name))
		k := h.Sum64()
		q = &queue{b: b, name: name, pubRng: rand.New(rand.NewPCG(b.cfg.seed, k)), ackRng: rand.New(rand.NewPCG(b.cfg.seed, k^0x9e3779b97f4a7c15)),
			subs: map[*Subscription]struct{}{}}
		b.queues[name] = q
	}
	return q, nil
}

// Publish enqueues copies of msgs on queue, creating it if needed. Only ID,
// Body, Headers and Key are kept; the broker fills in the rest on delivery.
// Messages without an ID are delivered like any other: judging them is the
// consumer's job. With the DuplicatePublish fault some messages are
// enqueued twice in a row.
func (b *Broker) Publish(ctx context.Context, queue string, msgs ...*driver.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, m := range msgs {
		if m == nil {
			return fmt.Errorf("memory: Publish: msgs[%d] is nil", i)
		}
	}
	q, err := b.queue(queue, true)
	if err != nil {
		return err
	}
	return q.publish(ctx, msgs, b.faults.Load().DuplicatePublish)
}

// Subscribe opens a subscription that receives from queue, creating the
// queue if needed. Several subscriptions may share one queue.
func (b *Broker) Subscribe(queue string) (*Subscription, error) {
	q, err := b.queue(queue, true)
	if err != nil {
		return nil, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, ErrBrokerClosed
	}
	q.subSeq++
	s := &Subscription{q: q, id: q.subSeq, done: make(chan struct{}), leases: map[*delivery]struct{}{}}
	q.subs[s] = struct{}{}
	return s, nil
}

// Stats returns the counters of queue; zero when it does not exist.
func (b *Broker) Stats(queue string) Stats {
	q, _ := b.queue(queue, false)
	if q == nil {
		return Stats{}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.stats
	st.Ready, st.Delayed, st.InFlight, st.DeadLetters = len(q.ready), len(q.delayed), q.inFlight, len(q.dead)
	return st
}

// Len returns how many messages queue still has to settle: ready, delayed
// for a retry, or in flight. Dead letters are not counted.
func (b *Broker) Len(queue string) int {
	st := b.Stats(queue)
	return st.Ready + st.Delayed + st.InFlight
}

// DeadLetters returns the messages parked on queue by DeadLetter, oldest
// first, with their causes.
func (b *Broker) DeadLetters(queue string) []DeadLetter {
	q, _ := b.queue(queue, false)
	if q == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]DeadLetter, len(q.dead))
	for i, dl := range q.dead {
		out[i] = dl
		out[i].Message = cloneMessage(dl.Message)
	}
	return out
}

// Redrive moves every dead letter of queue back to the end of the queue and
// returns how many it moved. Redriven messages start again at attempt 1, as
// a message moved back from a dead-letter queue does.
func (b *Broker) Redrive(queue string) int {
	q, _ := b.queue(queue, false)
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0
	}
	n := len(q.dead)
	for _, dl := range q.dead {
		dl.entry.deliveries, dl.entry.lease = 0, nil
		q.makeReadyLocked(dl.entry)
	}
	q.dead = nil
	q.stats.Redriven += int64(n)
	return n
}

// WaitIdle blocks until queue has nothing ready, delayed or in flight (Len
// is 0), ctx is done, or the broker is closed. It returns at once when the
// queue is already idle, including a queue nothing was published to yet. A
// lost ack keeps its message in flight until the visibility timeout
// expires and it is redelivered, so WaitIdle waits for that too.
func (b *Broker) WaitIdle(ctx context.Context, queue string) error {
	q, err := b.queue(queue, true)
	if err != nil {
		return err
	}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrBrokerClosed
	}
	if q.lenLocked() == 0 {
		q.mu.Unlock()
		return nil
	}
	if q.idle == nil {
		q.idle = make(chan struct{})
	}
	ch := q.idle
	q.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-b.done:
		return ErrBrokerClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the broker: timers stop, blocked Receive and WaitIdle calls
// return ErrBrokerClosed, and every later operation fails with it. Messages
// still queued are dropped with the broker, as with an in-memory queue of a
// process that exits. Close is idempotent.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.closed = true
		close(b.done)
		qs := slices.Collect(maps.Values(b.queues))
		b.mu.Unlock()
		for _, q := range qs {
			q.close()
		}
	})
	return nil
}

// DeadLetter is a message parked by Subscription.DeadLetter.
type DeadLetter struct {
	// Message is the message as last delivered; Attempt is how many times
	// it was delivered.
	Message driver.Message
	// Cause is the error given to DeadLetter.
	Cause error
	// At is when it was parked.
	At time.Time

	entry *entry // for Redrive
}

// Stats are a queue's gauges and cumulative counters.
type Stats struct {
	// Ready is how many messages wait to be received now.
	Ready int
	// Delayed is how many messages wait for a retry delay to pass.
	Delayed int
	// InFlight is how many messages are leased to a subscription,
	// including ones whose ack was lost.
	InFlight int
	// DeadLetters is how many messages are parked now.
	DeadLetters int

	// Published counts enqueued messages, duplicates from the
	// DuplicatePublish fault included.
	Published int64
	// DuplicatesPublished counts the extra copies DuplicatePublish made.
	DuplicatesPublished int64
	// Delivered counts deliveries, redeliveries included.
	Delivered int64
	// Redelivered counts deliveries with Attempt > 1.
	Redelivered int64
	// Acked counts messages removed by an ack.
	Acked int64
	// AcksLost counts acks dropped by the LoseAck fault.
	AcksLost int64
	// Retried counts Retry settlements.
	Retried int64
	// DeadLettered counts DeadLetter settlements.
	DeadLettered int64
	// Expired counts leases that reached the visibility timeout.
	Expired int64
	// Requeued counts messages returned to the queue by Release, or
	// because the subscription holding them crashed or closed.
	Requeued int64
	// Crashes counts subscription crashes, injected or explicit.
	Crashes int64
	// StaleSettlements counts settlements refused with ErrLeaseExpired.
	StaleSettlements int64
	// Redriven counts dead letters moved back by Redrive.
	Redriven int64
}
