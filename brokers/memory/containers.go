package memory

import "time"

// deque is a growable ring buffer: the FIFO of ready messages. It supports
// pushing at the front so that requeued messages (crash, close) are
// redelivered first, as RabbitMQ returns them to their original position.
type deque[T any] struct {
	buf  []T
	head int
	n    int
}

func (d *deque[T]) len() int { return d.n }

func (d *deque[T]) grow() {
	if d.n < len(d.buf) {
		return
	}
	size := 2 * len(d.buf)
	if size < 16 {
		size = 16
	}
	nb := make([]T, size)
	for i := 0; i < d.n; i++ {
		nb[i] = d.buf[(d.head+i)%len(d.buf)]
	}
	d.buf, d.head = nb, 0
}

func (d *deque[T]) pushBack(v T) {
	d.grow()
	d.buf[(d.head+d.n)%len(d.buf)] = v
	d.n++
}

func (d *deque[T]) pushFront(v T) {
	d.grow()
	d.head = (d.head - 1 + len(d.buf)) % len(d.buf)
	d.buf[d.head] = v
	d.n++
}

func (d *deque[T]) popFront() (T, bool) {
	var zero T
	if d.n == 0 {
		return zero, false
	}
	v := d.buf[d.head]
	d.buf[d.head] = zero // let the GC have it
	d.head = (d.head + 1) % len(d.buf)
	d.n--
	return v, true
}

// each calls f for every element from front to back.
func (d *deque[T]) each(f func(T)) {
	for i := 0; i < d.n; i++ {
		f(d.buf[(d.head+i)%len(d.buf)])
	}
}

// clear drops every element.
func (d *deque[T]) clear() { *d = deque[T]{} }

// hnode is the bookkeeping an element of a timeHeap carries, so it can be
// removed in O(log n) when a lease is settled before it expires.
type hnode struct {
	at  time.Time
	idx int // position in the heap; -1 when not in it
}

type timed interface{ node() *hnode }

// timeHeap is an indexed min-heap ordered by hnode.at: delayed retries and
// lease deadlines. One timer per queue fires at the earliest entry, so no
// goroutine waits per message.
type timeHeap[T timed] struct{ items []T }

func (h *timeHeap[T]) len() int { return len(h.items) }

func (h *timeHeap[T]) less(i, j int) bool {
	return h.items[i].node().at.Before(h.items[j].node().at)
}

func (h *timeHeap[T]) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].node().idx = i
	h.items[j].node().idx = j
}

func (h *timeHeap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *timeHeap[T]) down(i int) {
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h.swap(i, m)
		i = m
	}
}

func (h *timeHeap[T]) push(v T) {
	v.node().idx = len(h.items)
	h.items = append(h.items, v)
	h.up(len(h.items) - 1)
}

// peek returns the earliest element.
func (h *timeHeap[T]) peek() (T, bool) {
	if len(h.items) == 0 {
		var zero T
		return zero, false
	}
	return h.items[0], true
}

// remove takes v out of the heap; it is a no-op when v is not in it.
func (h *timeHeap[T]) remove(v T) {
	i := v.node().idx
	if i < 0 || i >= len(h.items) {
		return
	}
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	var zero T
	h.items[last] = zero
	h.items = h.items[:last]
	v.node().idx = -1
	if i != last {
		h.down(i)
		h.up(i)
	}
}

// fix restores the order after v's time changed.
func (h *timeHeap[T]) fix(v T) {
	i := v.node().idx
	if i < 0 || i >= len(h.items) {
		return
	}
	h.down(i)
	h.up(i)
}

func (h *timeHeap[T]) clear() {
	for _, v := range h.items {
		v.node().idx = -1
	}
	h.items = nil
}
