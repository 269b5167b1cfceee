package memory

import (
	"container/heap"
	"time"
)

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

// peek returns the earliest element.
func (h timeHeap[T]) peek() (T, bool) {
	if len(h) == 0 {
		var zero T
		return zero, false
	}
	return h[0], true
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
