package benchmark

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// headerTS carries a message's publish time (Unix nanoseconds, an AMQP
// long) so the consumer can measure publish-to-decision latency.
const headerTS = "x-bench-ts"

// payment is the body of every message, as in examples/payments.
type payment struct {
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
}

// workload is one run's messages: n backlog ids ("m…") in order with dups
// copies of recent ids mixed in, then paced ids ("p…"). Account and amount
// are functions of the id's number, so expected balances need no list.
type workload struct {
	n, accounts int
	// seq is the backlog's publish order (the id number of each delivery);
	// it is dropped once published, deliveries keeps its length.
	seq        []int32
	deliveries int
}

func newWorkload(n, dups, accounts int, seed uint64) *workload {
	w := &workload{n: n, accounts: accounts, seq: make([]int32, 0, n+dups)}
	rng := rand.New(rand.NewPCG(seed, 0x1de3))
	next, left := 0, dups
	for next < n || left > 0 {
		// A duplicate is a copy of one of the last 1,000 ids, as a
		// redelivery or a producer's retry would be: some land in the same
		// batch as their original, some in a later one.
		if left > 0 && next > 0 && (next == n || rng.IntN(n-next+left) < left) {
			w.seq = append(w.seq, int32(next-1-rng.IntN(min(next, 1000))))
			left--
			continue
		}
		w.seq = append(w.seq, int32(next))
		next++
	}
	w.deliveries = len(w.seq)
	return w
}

func backlogID(i int) string { return "m" + strconv.Itoa(100000000 + i)[1:] }
func pacedID(i int) string   { return "p" + strconv.Itoa(100000000 + i)[1:] }

// account and amount spread ids over the accounts pseudo-randomly, so a
// batch often holds several messages for one account.
func (w *workload) account(num int) int {
	return int((uint64(num)*0x9E3779B97F4A7C15)>>20) % w.accounts
}

func (w *workload) amount(num int) int64 { return 1 + int64(num*7919)%10000 }

// body is the JSON payment of id number num; paced ids number from n up.
func (w *workload) body(num int) []byte {
	b, _ := json.Marshal(payment{Account: accountName(w.account(num)), AmountCents: w.amount(num)})
	return b
}

func accountName(a int) string { return "acc-" + strconv.Itoa(a) }

// expected returns the balance of each account after the backlog and
// paced messages were each applied once.
func (w *workload) expected(paced int) map[string]int64 {
	bal := make(map[string]int64, w.accounts)
	for a := range w.accounts {
		bal[accountName(a)] = 0
	}
	for num := range w.n + paced {
		bal[accountName(w.account(num))] += w.amount(num)
	}
	return bal
}

// tracker counts decisions and records publish-to-decision latencies. The
// consumer under test calls decided once per final decision of a delivery
// (processed, duplicate; a retried delivery is decided again later).
type tracker struct {
	backlog int64
	count   atomic.Int64
	total   atomic.Int64 // -1 until the paced phase knows how many it sent

	backlogDone chan struct{}
	allDone     chan struct{}
	backlogOnce sync.Once
	allOnce     sync.Once
	backlogAt   atomic.Int64 // Unix nanos of the last backlog decision
	firstAt     atomic.Int64 // Unix nanos of the first decision

	mu       sync.Mutex
	pacedLat []time.Duration // exact: the paced phase is small
	// backlogLat is a histogram: a slice as long as the backlog would make
	// the benchmark's own memory grow with the queue's depth.
	backlogLat histogram
	batches    atomic.Int64
}

// histogram counts durations in buckets 2% wide from 1µs up, so that
// percentiles are within 2% whatever the number of samples.
type histogram struct {
	buckets [1100]int64
	n       int64
}

const histBase = 1.02

func (h *histogram) add(d time.Duration) {
	us := float64(d) / float64(time.Microsecond)
	i := 0
	if us > 1 {
		i = min(int(math.Log(us)/math.Log(histBase))+1, len(h.buckets)-1)
	}
	h.buckets[i]++
	h.n++
}

// percentile returns the upper bound of the bucket holding the p-th
// fraction of the samples.
func (h *histogram) percentile(p float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := int64(math.Ceil(p * float64(h.n)))
	var c int64
	for i, b := range h.buckets {
		c += b
		if c >= rank {
			return time.Duration(math.Pow(histBase, float64(i)) * float64(time.Microsecond))
		}
	}
	return 0
}

func newTracker(backlog int) *tracker {
	t := &tracker{backlog: int64(backlog), backlogDone: make(chan struct{}), allDone: make(chan struct{})}
	t.total.Store(-1)
	if backlog == 0 {
		t.backlogAt.Store(time.Now().UnixNano())
		close(t.backlogDone)
	}
	return t
}

// decided records the decision of one delivery of id, published at ts
// (Unix nanos; 0 if unknown).
func (t *tracker) decided(id string, ts int64) {
	now := time.Now().UnixNano()
	if ts > 0 {
		lat := time.Duration(now - ts)
		t.mu.Lock()
		if len(id) > 0 && id[0] == 'p' {
			t.pacedLat = append(t.pacedLat, lat)
		} else {
			t.backlogLat.add(lat)
		}
		t.mu.Unlock()
	}
	t.firstAt.CompareAndSwap(0, now)
	c := t.count.Add(1)
	if c == t.backlog {
		t.backlogAt.Store(now)
		t.backlogOnce.Do(func() { close(t.backlogDone) })
	}
	t.checkAll(c)
}

func (t *tracker) checkAll(c int64) {
	if tot := t.total.Load(); tot >= 0 && c >= tot {
		t.allOnce.Do(func() { close(t.allDone) })
	}
}

// setTotal fixes the number of deliveries to expect, backlog included.
func (t *tracker) setTotal(n int) {
	t.total.Store(int64(n))
	t.checkAll(t.count.Load())
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// waitProgress waits until ch closes, failing if no decision was made for
// stall, and printing a progress line every few seconds.
func (t *tracker) waitProgress(ctx context.Context, ch <-chan struct{}, failed <-chan error, stall time.Duration, progress func(int64)) error {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	last, lastAt := t.count.Load(), time.Now()
	for {
		select {
		case <-ch:
			return nil
		case err := <-failed:
			if err == nil {
				err = fmt.Errorf("consumer stopped early")
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			c := t.count.Load()
			if c != last {
				last, lastAt = c, time.Now()
			} else if time.Since(lastAt) > stall {
				return fmt.Errorf("stalled: no decision for %v after %d deliveries", stall, c)
			}
			if progress != nil {
				progress(c)
			}
		}
	}
}
