package kafka

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/core/driver"
)

// The picker chooses which waiting message of a partition goes out next.
// Scanning for the first one the ordering allows costs O(waiting) when most
// sit behind a busy key; instead each partition keeps them at hand:
//
//   - a lane holds the messages that go one at a time in offset order: one
//     key's (OrderPerKey) or the partition's (OrderPerPartition); keyless
//     messages and OrderNone have none. Under a Consumer that keeps each
//     key's order itself (early), a key's lane hands out its messages in
//     offset order without waiting for their settlements; until one of
//     them is retried or skipped (eager), all of a lane's messages are
//     candidates from their fetch, when their entry is still in the cache,
//     rather than each when the one before goes out.
//   - the messages that may go now (heads of idle lanes, laneless ones) are
//     in fresh, a FIFO of those that became candidates in offset order (newly
//     fetched ones: O(1)), or else in ready, a min-heap by offset; pick takes
//     the lower front, so the commit point advances.
//   - delayed holds by notBefore those waiting for a retry time; a lane whose
//     head is delayed stays closed, so its key is never overtaken.
//
// Invariant: a busy lane (a message out) has none among the candidates; an
// idle lane has its head, and only it. Early, a lane's head is among the
// candidates (an eager lane's every message); an entry put back ahead of it
// makes the head's entry there stale, and pick skips it. A pick or
// settlement is O(log n).

// partition tracks one assigned partition between fetch and commit.
type partition struct {
	src            *Source
	topic, idText  string // idText: the id in decimal, for every message's metadata
	id             int32
	retry          bool     // a partition of the retry topic
	early          bool     // a lane's next messages go out before the earlier are settled
	revoking, dead bool     // no more hand-outs; settlements refused (given up)
	dirty, paused  bool     // something to commit; fetching paused (throttle)
	out, waiting   int      // messages handed out, not settled; fetched or retried and not handed out
	decided        int      // entries decided (behind an undecided one)
	entries        []*entry // fetched and not below the commit point, in offset order
	// The entries waiting to go out, arranged for pick.
	order   Ordering
	lanes   map[string]*lane // OrderPerKey: per key, while in play
	one     *lane            // OrderPerPartition: the partition's lane
	fresh   fifo             // may go now, fetched so, in offset order
	ready   keyHeap          // may go now, the others, by offset
	delayed keyHeap          // may go once their notBefore passes, by it
	// next follows the last fetched offset (negative until known); high is
	// the highest handed out, prevHigh and skip the highest handed out and
	// the offsets decided before, per the commit metadata.
	next, committed, high, prevHigh int64
	skip                            []span
}

func (s *Source) newPartition(topic string, id int32) *partition {
	return &partition{src: s, topic: topic, id: id, idText: strconv.Itoa(int(id)), retry: topic == s.cfg.retryTopic,
		order: s.cfg.ordering, early: s.early && s.cfg.ordering == OrderPerKey, next: -1, committed: -1, high: -1, prevHigh: -1}
}

type entryState uint8

const (
	waiting entryState = iota
	handed
	done
)

// entry is one fetched record; it is the AckID of the messages handed out
// from it.
type entry struct {
	p                          *partition
	r                          *kgo.Record
	state                      entryState
	notBefore                  time.Time
	baseTry, handouts, attempt int   // attempts the record itself records (retry topic); hand-outs by this process; the last hand-out's
	lane                       *lane // the lane it waits in; nil when nothing orders it
	recalled                   bool  // out when an earlier message of its lane was retried (early)
	first                      driver.Message
}

// wrap names e's record in err.
func (e *entry) wrap(err error) error {
	return fmt.Errorf("kafka: record %s/%d@%d: %w", e.r.Topic, e.r.Partition, e.r.Offset, err)
}

// advance drops the contiguous decided prefix. s.mu is held.
func (p *partition) advance() {
	i := 0
	for i < len(p.entries) && p.entries[i].state == done {
		i++
	}
	clear(p.entries[:i])
	p.entries, p.decided = p.entries[i:], p.decided-i
	p.throttle()
}

// throttle pauses fetching the partition while WithPartitionBuffer
// messages are held past their fetch (handed out, or decided behind an
// undecided one), and resumes it once a quarter of that is free. Waiting
// messages are bounded by the source as a whole (Source.poll): a pause
// drops what franz-go buffered for the partition, to be fetched and
// decoded again, so it is kept for a partition held up. s.mu is held.
func (p *partition) throttle() {
	held, n := len(p.entries)-p.waiting, p.src.held
	switch {
	case !p.paused && held >= n && !p.dead:
		p.paused = true
		p.src.member.PauseFetchPartitions(map[string][]int32{p.topic: {p.id}})
	case p.paused && held <= n-n/4 && !p.dead:
		p.paused = false
		p.src.member.ResumeFetchPartitions(map[string][]int32{p.topic: {p.id}})
	}
}

// progress returns the decided runs above the commit point, fetched or
// inherited from the previous owner and not fetched yet. s.mu is held.
func (p *partition) progress() []span {
	var out []span
	// The walk stops at the last decided entry, short of those waiting.
	for i, left := 0, p.decided; left > 0 && i < len(p.entries); i++ {
		if p.entries[i].state != done {
			continue
		}
		j := i
		for j+1 < len(p.entries) && p.entries[j+1].state == done {
			j++
		}
		left -= j - i + 1
		first, last := p.entries[i].r.Offset, p.entries[j].r.Offset
		out = append(out, span{first, last - first + 1})
		i = j
	}
	return append(out, dropBelow(p.skip, p.next)...)
}

// lane is the queue of waiting messages that go out in offset order, one
// at a time unless early.
type lane struct {
	key    string // its key in partition.lanes; unused for the partition lane
	out    int    // its messages handed out and not settled
	recall int    // recalled messages still out: the lane hands out nothing until they are back
	// eager (early): each of its messages has been a candidate since its
	// fetch, so one going out makes none of the others one.
	eager bool
	fifo
}

// fifo is a queue of entries in offset order.
type fifo struct {
	items []*entry // items[head:] are queued
	head  int      // popped slots before it are nil, reused by a retry
}

func (q *fifo) len() int { return len(q.items) - q.head }

func (q *fifo) front() *entry { return q.items[q.head] }

func (q *fifo) popFront() {
	q.items[q.head], q.head = nil, q.head+1
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
}

// pushBack appends an entry, reclaiming the popped slots only when the
// array is full so that appends stay amortised O(1).
func (q *fifo) pushBack(e *entry) {
	if len(q.items) == cap(q.items) && q.head > 0 {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, e)
}

// insert puts a retried message back in its place by offset: normally the
// slot it was popped from, as the lane's head.
func (q *fifo) insert(e *entry) {
	i, _ := slices.BinarySearchFunc(q.items[q.head:], e.r.Offset, func(x *entry, off int64) int { return cmp.Compare(x.r.Offset, off) })
	if i == 0 && q.head > 0 {
		q.head--
		q.items[q.head] = e
		return
	}
	q.items = slices.Insert(q.items, q.head+i, e)
}

// keyHeap is a min-heap of entries by offset (ready) or notBefore in Unix
// nanoseconds (delayed), the key beside the pointer so that sifting does
// not chase pointers; hand-written to avoid container/heap's interface calls.
type keyHeap []keyed

type keyed struct {
	key int64
	e   *entry
}

func (h *keyHeap) push(key int64, e *entry) {
	*h = append(*h, keyed{key, e})
	s := *h
	for i := len(s) - 1; i > 0; {
		up := (i - 1) / 2
		if s[up].key <= s[i].key {
			break
		}
		s[up], s[i] = s[i], s[up]
		i = up
	}
}

func (h *keyHeap) pop() *entry {
	s := *h
	e := s[0].e
	n := len(s) - 1
	s[0], s[n] = s[n], keyed{}
	s = s[:n]
	for i := 0; ; {
		m := 2*i + 1
		if m >= n {
			break
		}
		if r := m + 1; r < n && s[r].key < s[m].key {
			m = r
		}
		if s[i].key <= s[m].key {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return e
}

// laneOf returns the lane e waits in under p's ordering, created if need
// be, or nil when nothing orders e.
func (p *partition) laneOf(e *entry) *lane {
	switch {
	case p.order == OrderNone || p.order == OrderPerKey && len(e.r.Key) == 0:
		return nil
	case p.order == OrderPerPartition:
		if p.one == nil {
			p.one = &lane{}
		}
		return p.one
	}
	l := p.lanes[string(e.r.Key)]
	if l == nil {
		l = &lane{key: string(e.r.Key), eager: p.early}
		if p.lanes == nil {
			p.lanes = map[string]*lane{}
		}
		p.lanes[l.key] = l
	}
	return l
}

// candidate puts e, which may go as far as the ordering is concerned,
// where pick finds it: in fresh if it is due and above everything there
// (a newly fetched message), else in the heap for now or for later.
func (p *partition) candidate(e *entry) {
	switch {
	case !e.notBefore.IsZero():
		p.delayed.push(e.notBefore.UnixNano(), e)
	case p.fresh.len() == 0 || p.fresh.items[len(p.fresh.items)-1].r.Offset < e.r.Offset:
		p.fresh.pushBack(e)
	default:
		p.ready.push(e.r.Offset, e)
	}
}

// fetched makes a newly fetched message wait for its turn. s.mu is held.
func (p *partition) fetched(e *entry) {
	p.waiting++
	l := p.laneOf(e)
	e.lane = l
	if l == nil {
		p.candidate(e)
		return
	}
	l.pushBack(e)
	if l.eager || l.len() == 1 && (l.out == 0 || p.early) {
		p.candidate(e)
	}
}

// pick returns the waiting entry the ordering allows with the lowest
// offset, no longer waiting and counted out of its lane, or nil. s.mu is
// held.
func (p *partition) pick(now time.Time) *entry {
	for len(p.delayed) > 0 && p.delayed[0].key <= now.UnixNano() {
		e := p.delayed.pop()
		p.ready.push(e.r.Offset, e)
	}
	for {
		var e *entry
		switch {
		case p.fresh.len() > 0 && (len(p.ready) == 0 || p.fresh.front().r.Offset < p.ready[0].key):
			e = p.fresh.front()
			p.fresh.popFront()
		case len(p.ready) > 0:
			e = p.ready.pop()
		default:
			return nil
		}
		l := e.lane
		if l != nil && (e.state != waiting || l.len() == 0 || l.front() != e || e.notBefore.After(now) || l.recall > 0) {
			// Stale (early): an entry came back ahead of it, it went out
			// since, or the lane waits for a recall. Dropped here, it is
			// made a candidate again in its turn.
			l.eager = false
			continue
		}
		if l != nil {
			l.popFront()
			l.out++
			if p.early && !l.eager && l.len() > 0 {
				p.candidate(l.front())
			}
		}
		p.waiting--
		return e
	}
}

// recall closes the lane of e, about to be retried, until the messages
// of its lane handed out after it are back (the Consumer hands them back,
// or settles those it decided): one of them going back only after a later
// one went out again would break the order (early). s.mu is held.
func (p *partition) recall(e *entry) {
	l := e.lane
	if !p.early || l == nil {
		return
	}
	l.eager = false
	for _, x := range p.entries {
		if x.lane == l && x.state == handed && x.r.Offset > e.r.Offset && !x.recalled {
			x.recalled = true
			l.recall++
		}
	}
}

// settled counts e, handed out and now decided or (retry, its notBefore
// set) back to wait in its place, out of its lane, so the lane's next may
// go. s.mu is held.
func (p *partition) settled(e *entry, retry bool) {
	if retry {
		p.waiting++
	}
	l := e.lane
	if l == nil {
		if retry {
			p.candidate(e)
		}
		return
	}
	reopen := false
	if e.recalled {
		e.recalled = false
		l.recall--
		reopen = l.recall == 0
	}
	if retry {
		l.insert(e) // a candidate only in its turn, so the lane is eager no more
		l.eager = false
	}
	l.out--
	switch {
	case p.early:
		if (reopen || retry && l.front() == e) && l.len() > 0 && l.recall == 0 {
			p.candidate(l.front())
		}
	case l.out == 0 && l.len() > 0:
		p.candidate(l.front())
	}
	if l.out == 0 && l.len() == 0 && l != p.one {
		// Empty and idle: drop it so the map holds only keys in play.
		delete(p.lanes, l.key)
	}
}
