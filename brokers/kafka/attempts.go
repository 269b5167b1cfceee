package kafka

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"
)

// Kafka keeps no delivery count, so Attempt comes from a count of this
// process, per message (cluster, group, topic, partition, offset) handed
// out by any of its Sources, dropped once the group commits past it. A new
// process starts at 1 again: a message that crashes the process on every
// delivery is not caught by core.WithMaxAttempts.
//
// While a partition stays with a Source the count lives in the fetched
// entry (entry.handouts): no lock and no map write per message. When a
// generation ends, the counts of the entries handed out and not committed
// move to the process-wide attempts, where the next Source to fetch the
// offset (this one or another of the process) takes them back.

type partKey struct {
	brokers, group, topic string
	partition             int
}

// maxCountedPerPartition bounds the remembered counts per partition; past
// it the oldest half is dropped (those messages restart at attempt 1).
const maxCountedPerPartition = 100_000

// attemptCounter holds the hand-out counts of offsets whose partition
// left a Source before the group committed past them.
type attemptCounter struct {
	n  atomic.Int64 // counts held, so that the common case takes no lock
	mu sync.Mutex
	m  map[partKey]map[int64]int
}

var attempts = &attemptCounter{m: make(map[partKey]map[int64]int)}

// take returns and forgets the count remembered for offset (0 if none).
func (a *attemptCounter) take(k partKey, offset int64) int {
	if a.n.Load() == 0 {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.m[k][offset]
	if ok {
		a.drop(k, func(o int64) bool { return o == offset })
	}
	return n
}

// remember keeps count for offset until a Source takes it or the group
// commits past it.
func (a *attemptCounter) remember(k partKey, offset int64, count int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	pm := a.m[k]
	if pm == nil {
		pm = make(map[int64]int)
		a.m[k] = pm
	}
	if _, ok := pm[offset]; !ok && len(pm) >= maxCountedPerPartition {
		lowest := min(offset, slices.Min(slices.Collect(maps.Keys(pm))))
		cut := lowest + (offset-lowest)/2
		a.drop(k, func(o int64) bool { return o <= cut })
		pm = a.m[k]
		if pm == nil {
			pm = make(map[int64]int)
			a.m[k] = pm
		}
	}
	if _, ok := pm[offset]; !ok {
		a.n.Add(1)
	}
	pm[offset] = count
}

// forgetBelow drops the counts of offsets the group committed past.
func (a *attemptCounter) forgetBelow(k partKey, offset int64) {
	if a.n.Load() == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.drop(k, func(o int64) bool { return o < offset })
}

// drop deletes the counts of k's offsets that match. a.mu is held.
func (a *attemptCounter) drop(k partKey, match func(int64) bool) {
	pm := a.m[k]
	before := len(pm)
	maps.DeleteFunc(pm, func(o int64, _ int) bool { return match(o) })
	a.n.Add(int64(len(pm) - before))
	if len(pm) == 0 {
		delete(a.m, k)
	}
}
