package kafka

import (
	"maps"
	"slices"
	"sync"
)

// Kafka keeps no delivery count, so Attempt comes from a counter of this
// process, per message (cluster, group, topic, partition, offset) handed
// out by any of its Sources, dropped once the group commits past it. A new
// process starts at 1 again: a message that crashes the process on every
// delivery is not caught by core.WithMaxAttempts.

type partKey struct {
	brokers, group, topic string
	partition             int
}

// maxCountedPerPartition bounds the counter's memory per partition; past
// it the oldest half is dropped (those messages restart at attempt 1).
const maxCountedPerPartition = 100_000

type attemptCounter struct {
	mu sync.Mutex
	m  map[partKey]map[int64]int
}

var attempts = &attemptCounter{m: make(map[partKey]map[int64]int)}

// next records one more hand-out of offset and returns its count.
func (a *attemptCounter) next(k partKey, offset int64) int {
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
		maps.DeleteFunc(pm, func(o int64, _ int) bool { return o <= cut })
	}
	pm[offset]++
	return pm[offset]
}

// forgetBelow drops the counts of offsets the group committed past.
func (a *attemptCounter) forgetBelow(k partKey, offset int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	pm := a.m[k]
	maps.DeleteFunc(pm, func(o int64, _ int) bool { return o < offset })
	if len(pm) == 0 {
		delete(a.m, k)
	}
}
