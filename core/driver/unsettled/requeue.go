package unsettled

import (
	"sync"
	"sync/atomic"
	"time"
)

// Attempts remembers, by message key, the attempt after which this process
// gave a message back for redelivery, for a broker that only flags a
// redelivery (a classic RabbitMQ queue): without it a message's Attempt
// would stop at 2, and the Consumer's maximum would never be reached. It
// keeps at most max keys, forgetting an arbitrary one to take another; a
// zero key (a message without an id) is not remembered. It is safe for
// concurrent use.
type Attempts[K comparable] struct {
	mu  sync.Mutex
	max int
	m   map[K]int
	n   atomic.Int64 // len(m), read without the lock by Forget
}

// NewAttempts returns an Attempts that keeps at most max keys.
func NewAttempts[K comparable](max int) *Attempts[K] {
	return &Attempts[K]{max: max, m: map[K]int{}}
}

// Requeued records that the message key was given back after attempt.
func (a *Attempts[K]) Requeued(key K, attempt int) {
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
func (a *Attempts[K]) Last(key K) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.m[key]
}

// Forget drops key once its message is settled for good (acknowledged or
// parked). While nothing is remembered, the common case, it takes no lock:
// it runs for every acknowledged message.
func (a *Attempts[K]) Forget(key K) {
	if a.n.Load() == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.m, key)
	a.n.Store(int64(len(a.m)))
}

// Delays runs a source's delayed settlements (a requeue at the end of a
// Retry delay, for a broker that cannot delay one itself) until Stop: Stop
// cancels those still waiting, whose deliveries the broker redelivers as it
// does every unsettled one when the source closes, and waits for those
// running. The zero value is ready to use; it is safe for concurrent use.
type Delays struct {
	mu      sync.Mutex
	stopped bool
	waiting map[*time.Timer]struct{}
	running sync.WaitGroup
}

// After runs f after d, unless Stop comes first. Once Stop was called it
// returns false and never runs f.
func (s *Delays) After(d time.Duration, f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	if s.waiting == nil {
		s.waiting = map[*time.Timer]struct{}{}
	}
	s.running.Add(1)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		defer s.running.Done()
		s.mu.Lock() // After holds it until t is recorded
		delete(s.waiting, t)
		s.mu.Unlock()
		f()
	})
	s.waiting[t] = struct{}{}
	return true
}

// Stop cancels the settlements still waiting and waits for the running
// ones to return.
func (s *Delays) Stop() {
	s.mu.Lock()
	s.stopped = true
	for t := range s.waiting {
		if t.Stop() {
			s.running.Done()
		}
	}
	clear(s.waiting)
	s.mu.Unlock()
	s.running.Wait()
}
