package core

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// BenchmarkFrameworkCost measures what the Consumer itself costs per
// message, with a source and a store that do nothing: receive, window,
// observers, batching, claim bookkeeping, settlement. It is the part of
// idemq's CPU that a hand-written consumer does not spend; compare the
// variants within one run.
//
//	go test -run '^$' -bench FrameworkCost -benchmem ./core/
func BenchmarkFrameworkCost(b *testing.B) {
	for _, v := range []struct {
		name string
		opts []Option
	}{
		{"batch1", []Option{WithBatchSize(1), WithWindow(5)}},
		{"batch200", []Option{WithBatchSize(200)}},
		{"batch200-observer", []Option{WithBatchSize(200), WithObserver(passObserver{})}},
	} {
		b.Run(v.name, func(b *testing.B) { RunFrameworkCost(b, v.opts...) })
	}
}

// RunFrameworkCost runs b.N messages through a Consumer on the do-nothing
// source and store with opts; BenchmarkFrameworkCostObserved (package
// core_test, which may import the observers) uses it too.
func RunFrameworkCost(b *testing.B, opts ...Option) {
	{
		{
			src := newBenchSource(b.N)
			store := benchStore{}
			h := func(context.Context, struct{}, []*Message) error { return nil }
			c, err := NewBatch(src, store, h, append([]Option{WithName("bench"), WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			src.onAllAcked = cancel
			b.ReportAllocs()
			b.ResetTimer()
			if err := c.Run(ctx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if got := src.acked.Load(); got != int64(b.N) {
				b.Fatalf("acked %d of %d", got, b.N)
			}
		}
	}
}

// passObserver observes every decision and stage and does nothing: the
// cost of observing itself.
type passObserver struct{}

func (passObserver) StartDecision(ctx context.Context, _ *Message) context.Context { return ctx }
func (passObserver) EndDecision(context.Context, *Message, Outcome)                {}
func (passObserver) StartStage(ctx context.Context, _ Stage) context.Context       { return ctx }
func (passObserver) EndStage(context.Context, Stage, error)                        {}

// benchSource hands out n prepared messages, then blocks.
type benchSource struct {
	mu         sync.Mutex
	ms         []*driver.Message
	acked      atomic.Int64
	n          int64
	onAllAcked func()
}

func newBenchSource(n int) *benchSource {
	s := &benchSource{ms: make([]*driver.Message, n), n: int64(n)}
	for i := range n {
		s.ms[i] = &driver.Message{
			ID:      "msg-" + strconv.Itoa(i),
			Body:    []byte(`{"account":"acc-0001","amount_cents":1234}`),
			Headers: map[string]string{"idemq-ts": "1"},
		}
	}
	return s
}

func (s *benchSource) Start(context.Context, driver.Setup) (driver.Traits, error) {
	return driver.Traits{DelaysRetry: true}, nil
}

func (s *benchSource) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	s.mu.Lock()
	n := min(max, len(s.ms))
	out := s.ms[:n:n]
	s.ms = s.ms[n:]
	s.mu.Unlock()
	if n > 0 {
		return out, nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *benchSource) Close() error { return nil }

func (s *benchSource) Ack(_ context.Context, ms []*driver.Message) error {
	if s.acked.Add(int64(len(ms))) == s.n {
		s.onAllAcked()
	}
	return nil
}

func (s *benchSource) Retry(context.Context, []*driver.Message, time.Duration) error { return nil }
func (s *benchSource) DeadLetter(context.Context, []*driver.Message, []error) error  { return nil }

// benchStore wins every claim and commits nothing.
type benchStore struct{}

func (benchStore) Begin(context.Context) (driver.Txn[struct{}], error) { return benchTxn{}, nil }
func (benchStore) Close() error                                        { return nil }
func (benchStore) As(any) bool                                         { return false }

type benchTxn struct{}

func (benchTxn) Tx() struct{} { return struct{}{} }
func (benchTxn) Claim(_ context.Context, _ string, cs []driver.Claim) ([]driver.ClaimResult, error) {
	rs := make([]driver.ClaimResult, len(cs))
	for i := range rs {
		rs[i] = driver.ClaimWon
	}
	return rs, nil
}
func (benchTxn) Unclaim(context.Context, string, []string) error { return nil }
func (benchTxn) Savepoint(context.Context) error                 { return nil }
func (benchTxn) RollbackToSavepoint(context.Context) error       { return nil }
func (benchTxn) ReleaseSavepoint(context.Context) error          { return nil }
func (benchTxn) Commit(context.Context) error                    { return nil }
func (benchTxn) Rollback(context.Context) error                  { return nil }
