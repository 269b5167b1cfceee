package memory

import (
	"bytes"
	"cmp"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/idemq/idemq/core/driver"
)

type entryState uint8

const (
	stateReady entryState = iota
	stateDelayed
	stateInFlight
	stateDone
	stateDead
)

// entry is one message the queue holds, from publish until ack or dead
// letter.
type entry struct {
	seq        uint64 // publish sequence, for metadata and tests
	msg        driver.Message
	deliveries int
	state      entryState
	lease      *delivery // the current lease while in flight
	delay      hnode     // ready time while delayed
}

func (e *entry) node() *hnode { return &e.delay }

// waiter is one Receive call blocked for a message.
type waiter struct {
	ch    chan struct{} // capacity 1: a wake-up is never lost nor blocks
	where uint8         // waitNone or waitQueue
}

const (
	waitNone uint8 = iota
	waitQueue
)

// queue holds one named queue's messages. Its mutex also guards the state
// of every subscription on it.
type queue struct {
	b      *Broker
	name   string
	pubRng *rand.Rand
	ackRng *rand.Rand

	mu       sync.Mutex
	closed   bool
	ready    deque[*entry]
	delayed  timeHeap[*entry]
	leases   timeHeap[*delivery]
	inFlight int
	dead     []DeadLetter
	waiters  []*waiter     // Receive calls waiting for a ready message, FIFO
	idle     chan struct{} // closed when the queue becomes idle
	subs     map[*Subscription]struct{}
	timer    *time.Timer
	timerAt  time.Time // when the timer fires next; zero when no fire is pending
	pubSeq   uint64
	delSeq   uint64
	subSeq   uint64
	stats    Stats
}

func cloneMessage(m driver.Message) driver.Message {
	m.Body = bytes.Clone(m.Body)
	m.Headers = maps.Clone(m.Headers)
	if mm, ok := m.Metadata.(driver.MetadataMap); ok {
		m.Metadata = maps.Clone(mm)
	}
	m.AckID, m.BrokerKey = nil, nil
	return m
}

func (q *queue) lenLocked() int { return q.ready.len() + q.delayed.len() + q.inFlight }

func (q *queue) publish(msgs []*driver.Message, dup float64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrBrokerClosed
	}
	n := 0
	for _, m := range msgs {
		copies := 1
		if dup > 0 && q.pubRng.Float64() < dup {
			copies = 2
			q.stats.DuplicatesPublished++
		}
		body, hdr := bytes.Clone(m.Body), maps.Clone(m.Headers)
		for range copies {
			q.pubSeq++
			e := &entry{seq: q.pubSeq, msg: driver.Message{ID: m.ID, Body: body, Headers: hdr, Key: m.Key}}
			e.delay.idx = -1
			q.ready.pushBack(e)
			q.stats.Published++
			n++
		}
	}
	q.wakeLocked(n)
	return nil
}

// wakeLocked wakes up to n Receive calls waiting for a message.
func (q *queue) wakeLocked(n int) { wake(&q.waiters, n) }

// wake wakes up to n of the waiters in *list, first come first served, and
// takes them off it.
func wake(list *[]*waiter, n int) {
	for ; n > 0 && len(*list) > 0; n-- {
		w := (*list)[0]
		(*list)[0] = nil
		*list = (*list)[1:]
		w.where = waitNone
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
	if len(*list) == 0 {
		*list = nil // release the backing array once drained
	}
}

// removeWaiterLocked takes w out of the waiters, if it is there.
func (q *queue) removeWaiterLocked(w *waiter) {
	if w.where == waitQueue {
		if i := slices.Index(q.waiters, w); i >= 0 {
			q.waiters = slices.Delete(q.waiters, i, i+1)
		}
	}
	w.where = waitNone
}

// deliverLocked leases e to s and returns the delivery.
func (q *queue) deliverLocked(s *Subscription, e *entry) *delivery {
	now := time.Now()
	e.deliveries++
	e.state = stateInFlight
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
	q.leases.push(d)
	q.armLocked()
	s.leases[d] = struct{}{}
	q.stats.Delivered++
	if e.deliveries > 1 {
		q.stats.Redelivered++
	}
	return d
}

// live reports whether d is still the broker's current lease of its
// message.
func (d *delivery) live() bool { return d.e.lease == d && d.e.state == stateInFlight }

// endLeaseLocked ends d's lease on the broker side; the caller moves the
// entry to its next state.
func (q *queue) endLeaseLocked(d *delivery) {
	q.leases.remove(d)
	delete(d.sub.leases, d)
	d.e.lease = nil
	q.inFlight--
}

// makeReadyLocked puts e back in the ready FIFO and wakes one receiver.
func (q *queue) makeReadyLocked(e *entry, front bool) {
	e.state = stateReady
	if front {
		q.ready.pushFront(e)
	} else {
		q.ready.pushBack(e)
	}
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
	if e, ok := q.delayed.peek(); ok {
		next = e.delay.at
	}
	if d, ok := q.leases.peek(); ok && (next.IsZero() || d.lease.at.Before(next)) {
		next = d.lease.at
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
	for {
		e, ok := q.delayed.peek()
		if !ok || e.delay.at.After(now) {
			break
		}
		q.delayed.remove(e)
		q.makeReadyLocked(e, false)
	}
	for {
		d, ok := q.leases.peek()
		if !ok || d.lease.at.After(now) {
			break
		}
		// The consumer may still hold d (its room in the Consumer's
		// window stays taken until it settles, and that settlement is
		// stale).
		q.endLeaseLocked(d)
		q.stats.Expired++
		q.makeReadyLocked(d.e, false)
	}
	q.armLocked()
}

// requeueLocked returns every message s still leases to the front of the
// queue, in delivery order, for a crash or close of s.
func (q *queue) requeueLocked(s *Subscription) {
	ds := make([]*delivery, 0, len(s.leases))
	for d := range s.leases {
		ds = append(ds, d)
	}
	slices.SortFunc(ds, func(a, b *delivery) int { return cmp.Compare(a.seq, b.seq) })
	for i := len(ds) - 1; i >= 0; i-- {
		q.endLeaseLocked(ds[i])
		q.makeReadyLocked(ds[i].e, true)
	}
	q.stats.Requeued += int64(len(ds))
}

func (q *queue) statsSnapshot() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.stats
	st.Ready = q.ready.len()
	st.Delayed = q.delayed.len()
	st.InFlight = q.inFlight
	st.DeadLetters = len(q.dead)
	return st
}

func (q *queue) redrive() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0
	}
	n := len(q.dead)
	for _, dl := range q.dead {
		e := dl.entry
		e.deliveries = 0
		e.lease = nil
		q.makeReadyLocked(e, false)
	}
	q.dead = nil
	q.stats.Redriven += int64(n)
	return n
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
		s.shutdownLocked(subBrokerClosed)
	}
	q.wakeLocked(len(q.waiters))
	q.ready.clear()
	q.delayed.clear()
	q.leases.clear()
}
