package sqlstore

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// countingPruner holds rows and deletes up to limit per call, failing the
// failAt-th call.
type countingPruner struct {
	mu     sync.Mutex
	rows   int
	calls  int
	failAt int
}

func (p *countingPruner) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.failAt > 0 && p.calls == p.failAt {
		return 0, errors.New("injected prune failure")
	}
	n := min(limit, p.rows)
	p.rows -= n
	return n, nil
}

func TestRunPrunerRetriesAfterAFailedRoundAndStopsWithCtx(t *testing.T) {
	p := &countingPruner{rows: 25, failAt: 2}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	now := time.Now()
	var cut time.Time
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); cut = now; return now }
	go func() {
		done <- RunPruner(ctx, p, PruneSchedule{Every: 10 * time.Millisecond, Batch: 10, Retention: time.Hour, Now: clock, Logger: slog.New(slog.DiscardHandler)})
	}()
	deadline := time.After(10 * time.Second)
	for {
		p.mu.Lock()
		left := p.rows
		p.mu.Unlock()
		if left == 0 {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("%d rows left after 10s", left)
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunPruner returned %v, want context.Canceled", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if cut.IsZero() {
		t.Error("RunPruner never read the clock")
	}
	for _, bad := range []PruneSchedule{{Batch: 1, Retention: 1}, {Every: 1, Retention: 1}, {Every: 1, Batch: 1}} {
		if err := RunPruner(context.Background(), p, bad); err == nil {
			t.Errorf("RunPruner(%+v): no error", bad)
		}
	}
	err := RunPruner(context.Background(), p, PruneSchedule{Every: time.Second, Batch: 1, Retention: time.Hour, Duty: 2})
	if err == nil || !strings.Contains(err.Error(), "Duty") {
		t.Errorf("RunPruner with Duty 2: %v, want an error naming Duty", err)
	}
}
