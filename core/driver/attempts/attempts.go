// Package attempts counts deliveries in process for a broker that only
// flags a redelivery (a classic RabbitMQ queue's redelivered bit): an
// adapter remembers after which attempt it handed a message back, so the
// next delivery's Attempt goes on from there and the Consumer's maximum is
// reached.
package attempts

import (
	"sync"
	"sync/atomic"
)

// Memo remembers, by message key, the attempt after which this process
// gave a message back for redelivery, for a broker that only flags a
// redelivery (a classic RabbitMQ queue): without it a message's Attempt
// would stop at 2, and the Consumer's maximum would never be reached. It
// keeps at most max keys, forgetting an arbitrary one to take another; a
// zero key (a message without an id) is not remembered. It is safe for
// concurrent use.
type Memo[K comparable] struct {
	mu  sync.Mutex
	max int
	m   map[K]int
	n   atomic.Int64 // len(m), read without the lock by Forget
}

// New returns a Memo that keeps at most max keys.
func New[K comparable](max int) *Memo[K] {
	return &Memo[K]{max: max, m: map[K]int{}}
}

// Requeued records that the message key was given back after attempt.
func (a *Memo[K]) Requeued(key K, attempt int) {
	var zero K
	if key == zero {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.m[key]; !ok && len(a.m) >= a.max {
		for k := range a.m {
			delete(a.m, k)
			break
		}
	}
	a.m[key] = attempt
	a.n.Store(int64(len(a.m)))
}

// Last returns the attempt after which key was last given back, or 0.
func (a *Memo[K]) Last(key K) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.m[key]
}

// Forget drops key once its message is settled for good (acknowledged or
// parked). While nothing is remembered, the common case, it takes no lock:
// it runs for every acknowledged message.
func (a *Memo[K]) Forget(key K) {
	if a.n.Load() == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.m, key)
	a.n.Store(int64(len(a.m)))
}
