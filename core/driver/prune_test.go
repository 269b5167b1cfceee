package driver

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// slowPruner holds rows claimed before cut and deletes up to limit per
// call, taking work per call; it records when each call started and ended.
type slowPruner struct {
	mu          sync.Mutex
	rows        int
	work        time.Duration
	starts, end []time.Time
	failAt      int
}

func (p *slowPruner) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.starts = append(p.starts, time.Now())
	time.Sleep(p.work)
	p.end = append(p.end, time.Now())
	if p.failAt > 0 && len(p.starts) == p.failAt {
		return 0, errors.New("injected prune failure")
	}
	n := min(limit, p.rows)
	p.rows -= n
	return n, nil
}

func TestPruneAllRestsBetweenBatches(t *testing.T) {
	p := &slowPruner{rows: 45, work: 5 * time.Millisecond}
	n, err := PruneAll(context.Background(), p, time.Now(), 10)
	if err != nil || n != 45 {
		t.Fatalf("PruneAll = %d, %v; want 45, nil", n, err)
	}
	if len(p.starts) != 5 {
		t.Fatalf("%d Prune calls, want 5 (four full batches and a short one)", len(p.starts))
	}
	checkRests(t, p, (1-DefaultPruneDuty)/DefaultPruneDuty)
	if _, err := PruneAll(context.Background(), p, time.Now(), 0); err == nil {
		t.Error("PruneAll with batch 0: no error")
	}
}

// checkRests fails unless every rest between two of p's calls lasted at
// least factor times the call before it.
func checkRests(t *testing.T, p *slowPruner, factor float64) {
	t.Helper()
	for i := 1; i < len(p.starts); i++ {
		took := p.end[i-1].Sub(p.starts[i-1])
		if rest := p.starts[i].Sub(p.end[i-1]); rest < time.Duration(factor*float64(took)) {
			t.Errorf("rested %v after batch %d, which took %v: want at least %.1f× as long", rest, i, took, factor)
		}
	}
}

func TestPruneRoundRestsByDuty(t *testing.T) {
	for _, duty := range []float64{1, 0.5, 0.1} {
		p := &slowPruner{rows: 30, work: 4 * time.Millisecond}
		n, err := PruneSchedule{Batch: 10, Duty: duty}.Round(context.Background(), p, time.Now())
		if err != nil || n != 30 {
			t.Fatalf("duty %v: Round = %d, %v; want 30, nil", duty, n, err)
		}
		if len(p.starts) != 4 {
			t.Errorf("duty %v: %d Prune calls, want 4 (three full batches and an empty one)", duty, len(p.starts))
		}
		checkRests(t, p, (1-duty)/duty)
	}
	for _, bad := range []PruneSchedule{{Batch: 10, Duty: -0.5}, {Batch: 10, Duty: 1.5}, {Batch: 0}} {
		if _, err := bad.Round(context.Background(), &slowPruner{rows: 1}, time.Now()); err == nil {
			t.Errorf("Round with %+v: no error", bad)
		}
	}
	err := RunPruner(context.Background(), &slowPruner{}, PruneSchedule{Every: time.Second, Batch: 1, Retention: time.Hour, Duty: 2})
	if err == nil || !strings.Contains(err.Error(), "Duty") {
		t.Errorf("RunPruner with Duty 2: %v, want an error naming Duty", err)
	}
}

func TestRunPrunerRetriesAfterAFailedRoundAndStopsWithCtx(t *testing.T) {
	p := &slowPruner{rows: 25, failAt: 2}
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
}
