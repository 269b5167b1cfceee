package brokertest

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

// The leased cases run core.NewLeased over the adapter: the External step
// stands for a payment API and counts its calls per id; Complete applies
// the effect row.

// externalCalls counts External calls per id.
type externalCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *externalCalls) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *externalCalls) of(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// runLeased starts a leased consumer whose Complete applies e's effect.
func runLeased(t *testing.T, src driver.Source, e *Effects, external func(ctx context.Context, m *core.Message) (string, error), lease, maxLease time.Duration, opts ...core.Option) *running {
	t.Helper()
	c, err := core.NewLeased(src, e.store, core.LeasedHandler[*sql.Tx, string]{
		External: external,
		Complete: func(ctx context.Context, tx *sql.Tx, m *core.Message, _ string) error { return e.Apply(ctx, tx, m) },
		Lease:    lease,
		MaxLease: maxLease,
	}, pipelineOptions(opts)...)
	if err != nil {
		t.Fatalf("core.NewLeased: %v", err)
	}
	return start(t, c)
}

// wantOnce checks that every message's effect was committed exactly once.
func wantOnce(t *testing.T, e *Effects, msgs []*driver.Message) {
	t.Helper()
	if counts := e.WantOnce(t, msgs); len(counts) != len(msgs) {
		t.Errorf("effects for %d ids, want %d", len(counts), len(msgs))
	}
}

// Copies of each id race across two leased consumers while the External
// call is slow: each id calls out once and applies once.
func testLeasedDuplicates(t *testing.T, h Harness) {
	const unique, copies = 15, 3
	f, e, msgs := h.published(t, "leased", unique, copies)
	var calls externalCalls
	external := func(ctx context.Context, m *core.Message) (string, error) {
		calls.add(m.ID)
		time.Sleep(30 * time.Millisecond)
		return "charged", nil
	}
	r1 := runLeased(t, source(t, f), e, external, 0, 0, core.WithWindow(10), core.WithBatchSize(5))
	r2 := runLeased(t, source(t, f), e, external, 0, 0, core.WithWindow(4))
	if p, _ := decideAll(t, 3*h.ReceiveTimeout, unique*copies, r1, r2); p != unique {
		t.Errorf("Processed = %d, want %d", p, unique)
	}
	wantOnce(t, e, msgs)
	for _, m := range msgs {
		if n := calls.of(m.ID); n != 1 {
			t.Errorf("%s: External called %d times, want once", m.ID, n)
		}
	}
	expectQuiet(t, h, receiver(t, f, 0))
}

// declines is an External step that fails bad for good ("card declined")
// and charges the others.
func declines(bad string) func(context.Context, *core.Message) (string, error) {
	return func(ctx context.Context, m *core.Message) (string, error) {
		if m.ID == bad {
			return "", core.Permanent(errors.New("card declined"))
		}
		return "charged", nil
	}
}

// A permanent External error parks the message with its cause; the rest
// complete.
func testLeasedPermanent(t *testing.T, h Harness) {
	f, e, msgs := h.published(t, "declined", 4, 1)
	bad := msgs[1].ID
	r := runLeased(t, source(t, f), e, declines(bad), 0, 0)
	r.finishWhen(t, h.ReceiveTimeout, "3 processed and 1 dead-lettered", func(st core.Stats) bool {
		return st.Processed == 3 && st.DeadLettered == 1
	})
	dl := waitDeadLetters(t, h, f, bad)[bad]
	if h.RecordsCause && !strings.Contains(dl.Cause, "card declined") {
		t.Errorf("parked cause %q does not say why", dl.Cause)
	}
	wantOnce(t, e, append(msgs[:1:1], msgs[2:]...))
}

// The consumer dies while one External call hangs: the broker redelivers
// its messages to a second consumer, which waits out the lease, takes it
// over, calls out again with the same message and completes; when the hung
// call returns at last, nothing is applied twice.
func testLeasedTakeOver(t *testing.T, h Harness) {
	f, e, msgs := h.published(t, "hung", 6, 1)
	var calls externalCalls
	src1 := source(t, f)
	hung := make(chan string, 1)
	dead := make(chan struct{}) // closed once the first consumer's source is closed
	wake := make(chan struct{})
	var once sync.Once
	r1 := runLeased(t, src1, e, func(ctx context.Context, m *core.Message) (string, error) {
		calls.add(m.ID)
		first := false
		once.Do(func() { first = true })
		if !first {
			// Its other calls end after it died, so it acknowledges
			// nothing: the second consumer decides every message.
			<-dead
			return "charged", nil
		}
		hung <- m.ID
		_ = src1.Close() // the process dies; its call hangs on
		close(dead)
		<-wake
		return "charged", nil
	}, 200*time.Millisecond, 400*time.Millisecond, core.WithWindow(3))
	var hungID string
	select {
	case hungID = <-hung:
	case <-time.After(h.ReceiveTimeout):
		t.Fatal("no External call started")
	}
	r2 := runLeased(t, source(t, f), e, func(ctx context.Context, m *core.Message) (string, error) {
		calls.add(m.ID)
		return "charged", nil
	}, 200*time.Millisecond, 400*time.Millisecond, core.WithWindow(3))
	waitFor(t, 3*h.ReceiveTimeout, "the hung message taken over and completed", func() bool {
		return e.Counts(t)[hungID] == 1
	})
	close(wake)
	r1.shutdown(t)
	// Stopping the second consumer while it holds a redelivery would give
	// that back to the broker, so it stops once it decided all of them.
	r2.finishWhen(t, 3*h.ReceiveTimeout, "every message decided by the second consumer", func(st core.Stats) bool {
		return st.Processed+st.Duplicates >= int64(len(msgs))
	})
	if n := calls.of(hungID); n != 2 {
		t.Errorf("the hung message's External ran %d times, want 2 (the hung call and the takeover)", n)
	}
	wantOnce(t, e, msgs)
	expectQuiet(t, h, receiver(t, f, 0))
}
