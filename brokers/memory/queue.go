package memory

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"iter"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/core/driver"
)

// entry is one message the queue holds, from publish until ack or dead
// letter.
type entry struct {
	seq        uint64 // publish sequence, for metadata and tests
	msg        driver.Message
	deliveries int
	lease      *delivery // the current lease while in flight
	delay      hnode     // ready time while delayed
}

func (e *entry) node() *hnode { return &e.delay }

// queue holds one named queue's messages. Its mutex also guards the state
// of every subscription on it.
type queue struct {
	b      *Broker
	name   string
	pubRng *rand.Rand
	ackRng *rand.Rand

	mu       sync.Mutex
	closed   bool
	ready    []*entry // FIFO; requeued messages go to the front
	delayed  timeHeap[*entry]
	leases   timeHeap[*delivery]
	inFlight int
	dead     []DeadLetter
	waiters  []chan struct{} // blocked Receive calls, FIFO; capacity 1: a wake-up is never lost nor blocks
	idle     chan struct{}   // closed when the queue becomes idle
	subs     map[*Subscription]struct{}
	timer    *time.Timer
	timerAt  time.Time // when the timer fires next; zero when no fire is pending
	pubSeq   uint64
	delSeq   uint64
	subSeq   uint64
	stats    Stats
}

// cloneMessage copies m for a dead letter, without its handles.
func cloneMessage(m driver.Message) driver.Message {
	m.Body, m.Headers = bytes.Clone(m.Body), maps.Clone(m.Headers)
	m.AckID, m.BrokerKey = nil, nil
	return m
}

func (q *queue) lenLocked() int { return len(q.ready) + len(q.delayed) + q.inFlight }

// publish enqueues copies of msgs, injecting the trace context of ctx into
// their headers by the global propagator, as every idemq publisher does,
// so a producer's trace reaches the consumer.
func (q *queue) publish(ctx context.Context, msgs []*driver.Message, dup float64) error {
	traced := trace.SpanContextFromContext(ctx).IsValid()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrBrokerClosed
	}
	before := len(q.ready)
	for _, m := range msgs {
		copies := 1
		if dup > 0 && q.pubRng.Float64() < dup {
			copies = 2
			q.stats.DuplicatesPublished++
		}
		body, hdr := bytes.Clone(m.Body), maps.Clone(m.Headers)
		if traced {
			if hdr == nil {
				hdr = make(map[string]string, 2)
			}
			otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(hdr))
		}
		for range copies {
			q.pubSeq++
			e := &entry{seq: q.pubSeq, msg: driver.Message{ID: m.ID, Body: body, Headers: hdr, Key: m.Key}}
			e.delay.idx = -1 // not delayed
			q.ready = append(q.ready, e)
			q.stats.Published++
		}
	}
	q.wakeLocked(len(q.ready) - before)
	return nil
}

// wakeLocked wakes up to n Receive calls waiting for a message, first
// come first served, and takes them off the waiters.
func (q *queue) wakeLocked(n int) {
	for ; n > 0 && len(q.waiters) > 0; n-- {
		select {
		case q.waiters[0] <- struct{}{}:
		default:
		}
		q.waiters[0] = nil
		q.waiters = q.waiters[1:]
	}
	if len(q.waiters) == 0 {
		q.waiters = nil // release the backing array once drained
	}
}

// removeWaiterLocked takes w out of the waiters and reports whether it was
// still there (not woken).
func (q *queue) removeWaiterLocked(w chan struct{}) bool {
	i := slices.Index(q.waiters, w)
	if i >= 0 {
		q.waiters = slices.Delete(q.waiters, i, i+1)
	}
	return i >= 0
}

// deliverLocked leases e to s and returns the delivery.
func (q *queue) deliverLocked(s *Subscription, e *entry) *delivery {
	now := time.Now()
	e.deliveries++
	q.inFlight++
	q.delSeq++
	d := &delivery{sub: s, e: e, seq: q.delSeq}
	d.msg = driver.Message{
		ID:         e.msg.ID,
		Body:       bytes.Clone(e.msg.Body),
		Headers:    maps.Clone(e.msg.Headers),
		Key:        e.msg.Key,
		Source:     q.name,
		System:     System,
		Attempt:    e.deliveries,
		Metadata:   (*metadata)(d),
		ReceivedAt: now,
		AckID:      d,
		BrokerKey:  e,
	}
	e.lease = d
	d.lease.at = now.Add(q.b.cfg.visibility)
	heap.Push(&q.leases, d)
	q.armLocked()
	s.leases[d] = struct{}{}
	q.stats.Delivered++
	if e.deliveries > 1 {
		q.stats.Redelivered++
	}
	return d
}

// live reports whether d is still the broker's current lease of its
// message: every lease ends through endLeaseLocked.
func (d *delivery) live() bool { return d.e.lease == d }

// endLeaseLocked ends d's lease on the broker side; the caller puts the
// entry where it goes next.
func (q *queue) endLeaseLocked(d *delivery) {
	q.leases.remove(d)
	delete(d.sub.leases, d)
	d.e.lease = nil
	q.inFlight--
}

// makeReadyLocked puts e at the back of the ready FIFO and wakes one
// receiver.
func (q *queue) makeReadyLocked(e *entry) {
	q.ready = append(q.ready, e)
	q.wakeLocked(1)
}

// checkIdleLocked releases WaitIdle callers once nothing is left to settle.
func (q *queue) checkIdleLocked() {
	if q.idle != nil && q.lenLocked() == 0 {
		close(q.idle)
		q.idle = nil
	}
}

// armLocked makes sure the queue's single timer fires no later than the
// earliest delayed message or lease deadline. It never pushes the timer
// later: when a lease is settled early the timer fires for nothing and
// re-arms, which is cheaper than resetting it on every ack.
func (q *queue) armLocked() {
	var next time.Time
	if len(q.delayed) > 0 {
		next = q.delayed[0].delay.at
	}
	if len(q.leases) > 0 && (next.IsZero() || q.leases[0].lease.at.Before(next)) {
		next = q.leases[0].lease.at
	}
	if next.IsZero() || (!q.timerAt.IsZero() && !next.Before(q.timerAt)) {
		return
	}
	q.timerAt = next
	wait := time.Until(next)
	if q.timer == nil {
		q.timer = time.AfterFunc(wait, q.onTimer)
	} else {
		q.timer.Reset(wait)
	}
}

// onTimer makes due delayed messages ready and expires due leases. It may
// run early or twice after a Reset race; it only acts on what is due.
func (q *queue) onTimer() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.timerAt = time.Time{}
	now := time.Now()
	for len(q.delayed) > 0 && !q.delayed[0].delay.at.After(now) {
		q.makeReadyLocked(heap.Pop(&q.delayed).(*entry))
	}
	for len(q.leases) > 0 && !q.leases[0].lease.at.After(now) {
		q.expireLocked(q.leases[0])
	}
	q.armLocked()
}

// expireLocked ends d's lease and makes its message ready again. The
// consumer may still hold d: its settlement is then stale.
func (q *queue) expireLocked(d *delivery) {
	q.endLeaseLocked(d)
	q.stats.Expired++
	q.makeReadyLocked(d.e)
}

// requeueLocked ends the leases ds and puts their messages at the front of
// the queue, in delivery order, as a closed channel's unacknowledged
// messages go back.
func (q *queue) requeueLocked(ds []*delivery) {
	slices.SortFunc(ds, func(a, b *delivery) int { return cmp.Compare(a.seq, b.seq) })
	es := make([]*entry, len(ds))
	for i, d := range ds {
		q.endLeaseLocked(d)
		es[i] = d.e
	}
	q.ready = slices.Insert(q.ready, 0, es...)
	q.stats.Requeued += int64(len(ds))
	q.wakeLocked(len(ds))
}

// close stops the timer, wakes every blocked call and drops the messages.
func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	if q.timer != nil {
		q.timer.Stop()
	}
	q.timerAt = time.Time{}
	for s := range q.subs {
		s.shutdownLocked(ErrBrokerClosed)
	}
	q.wakeLocked(len(q.waiters))
	q.ready = nil
	q.delayed.clear()
	q.leases.clear()
}

// delivery is one lease of a message to a subscription, until the
// visibility timeout: its message's AckID.
type delivery struct {
	sub *Subscription
	e   *entry
	seq uint64
	msg driver.Message

	// guarded by the queue's mutex
	lease hnode // the lease deadline
}

func (d *delivery) node() *hnode { return &d.lease }

// metadata is a delivery's Message.Metadata, read from it when asked.
type metadata delivery

// All yields the delivery and publish sequences and the subscriber.
func (m *metadata) All() iter.Seq2[string, slog.Value] {
	return func(yield func(string, slog.Value) bool) {
		_ = yield(MetaDeliverySeq, slog.Uint64Value(m.seq)) &&
			yield(MetaPublishSeq, slog.Uint64Value(m.e.seq)) &&
			yield(MetaSubscriber, slog.Uint64Value(m.sub.id))
	}
}

// hnode is the bookkeeping an element of a timeHeap carries, so it can be
// removed in O(log n) when a lease is settled before it expires.
type hnode struct {
	at  time.Time
	idx int // position in the heap; -1 when not in it
}

type timed interface{ node() *hnode }

// timeHeap is an indexed min-heap ordered by hnode.at (a heap.Interface):
// delayed retries and lease deadlines. One timer per queue fires at the
// earliest entry, so no goroutine waits per message.
type timeHeap[T timed] []T

func (h timeHeap[T]) Len() int           { return len(h) }
func (h timeHeap[T]) Less(i, j int) bool { return h[i].node().at.Before(h[j].node().at) }

func (h timeHeap[T]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].node().idx, h[j].node().idx = i, j
}

// Push and Pop are heap.Interface's; use heap.Push and remove.
func (h *timeHeap[T]) Push(v any) {
	v.(T).node().idx = len(*h)
	*h = append(*h, v.(T))
}

func (h *timeHeap[T]) Pop() any {
	old := *h
	v := old[len(old)-1]
	clear(old[len(old)-1:])
	*h = old[:len(old)-1]
	v.node().idx = -1
	return v
}

// remove takes v out of the heap; it is a no-op when v is not in it.
func (h *timeHeap[T]) remove(v T) {
	if i := v.node().idx; i >= 0 && i < len(*h) && (*h)[i].node() == v.node() {
		heap.Remove(h, i)
	}
}

// clear empties the heap.
func (h *timeHeap[T]) clear() {
	for _, v := range *h {
		v.node().idx = -1
	}
	*h = nil
}
