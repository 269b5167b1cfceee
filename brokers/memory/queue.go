package memory

import (
	"bytes"
	"cmp"
	"container/heap"
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
			e.delay.idx = -1 // not delayed
			q.ready = append(q.ready, e)
			q.stats.Published++
			n++
		}
	}
	q.wakeLocked(n)
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

// makeReadyLocked puts e at the back of the ready FIFO and wakes one
// receiver.
func (q *queue) makeReadyLocked(e *entry) {
	e.state = stateReady
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
		q.makeReadyLocked(e)
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
		q.makeReadyLocked(d.e)
	}
	q.armLocked()
}

// requeueLocked ends the leases ds and puts their messages at the front of
// the queue, in delivery order, as a closed channel's unacknowledged
// messages go back.
func (q *queue) requeueLocked(ds []*delivery) {
	slices.SortFunc(ds, func(a, b *delivery) int { return cmp.Compare(a.seq, b.seq) })
	es := make([]*entry, len(ds))
	for i, d := range ds {
		q.endLeaseLocked(d)
		d.e.state = stateReady
		es[i] = d.e
	}
	q.ready = slices.Insert(q.ready, 0, es...)
	q.stats.Requeued += int64(len(ds))
	q.wakeLocked(len(ds))
}

func (q *queue) statsSnapshot() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.stats
	st.Ready = len(q.ready)
	st.Delayed = len(q.delayed)
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
		q.makeReadyLocked(e)
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
		s.shutdownLocked(ErrBrokerClosed)
	}
	q.wakeLocked(len(q.waiters))
	q.ready = nil
	q.delayed.clear()
	q.leases.clear()
}
