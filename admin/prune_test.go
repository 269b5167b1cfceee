package admin

import (
	"context"
	"errors"
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

func TestPruneRestsBetweenBatchesAtTheDefaultDuty(t *testing.T) {
	p := &slowPruner{rows: 45, work: 5 * time.Millisecond}
	var seen []int
	n, err := Prune(context.Background(), p, time.Now(), PruneOptions{Batch: 10, Progress: func(d int) { seen = append(seen, d) }})
	if err != nil || n != 45 {
		t.Fatalf("Prune = %d, %v; want 45, nil", n, err)
	}
	if len(p.starts) != 5 {
		t.Fatalf("%d Prune calls, want 5 (four full batches and a short one)", len(p.starts))
	}
	if len(seen) != 5 || seen[4] != 5 {
		t.Errorf("Progress saw %v, want 10 10 10 10 5", seen)
	}
	checkRests(t, p, (1-DefaultPruneDuty)/DefaultPruneDuty, 0)
	if _, err := Prune(context.Background(), p, time.Now(), PruneOptions{}); err == nil {
		t.Error("Prune with batch 0: no error")
	}
}

// checkRests fails unless every rest between two of p's calls lasted at
// least factor times the call before it, plus pause.
func checkRests(t *testing.T, p *slowPruner, factor float64, pause time.Duration) {
	t.Helper()
	for i := 1; i < len(p.starts); i++ {
		took := p.end[i-1].Sub(p.starts[i-1])
		if rest := p.starts[i].Sub(p.end[i-1]); rest < time.Duration(factor*float64(took))+pause {
			t.Errorf("rested %v after batch %d, which took %v: want at least %.1f× as long plus %v", rest, i, took, factor, pause)
		}
	}
}

func TestPruneRestsByDutyAndPause(t *testing.T) {
	for _, duty := range []float64{1, 0.5, 0.1} {
		p := &slowPruner{rows: 30, work: 4 * time.Millisecond}
		n, err := Prune(context.Background(), p, time.Now(), PruneOptions{Batch: 10, Duty: duty})
		if err != nil || n != 30 {
			t.Fatalf("duty %v: Prune = %d, %v; want 30, nil", duty, n, err)
		}
		if len(p.starts) != 4 {
			t.Errorf("duty %v: %d Prune calls, want 4 (three full batches and an empty one)", duty, len(p.starts))
		}
		checkRests(t, p, (1-duty)/duty, 0)
	}
	p := &slowPruner{rows: 20, work: time.Millisecond}
	if _, err := Prune(context.Background(), p, time.Now(), PruneOptions{Batch: 10, Duty: 1, Pause: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	checkRests(t, p, 0, 20*time.Millisecond)
	for _, bad := range []PruneOptions{{Batch: 10, Duty: -0.5}, {Batch: 10, Duty: 1.5}, {Batch: 0}, {Batch: 1, Pause: -1}} {
		if _, err := Prune(context.Background(), &slowPruner{rows: 1}, time.Now(), bad); err == nil {
			t.Errorf("Prune with %+v: no error", bad)
		}
	}
}

func TestPruneStopsAtAnErrorAndWithCtx(t *testing.T) {
	p := &slowPruner{rows: 25, failAt: 2}
	n, err := Prune(context.Background(), p, time.Now(), PruneOptions{Batch: 10, Duty: 1})
	if err == nil || n != 10 {
		t.Fatalf("Prune = %d, %v; want 10 and the injected failure", n, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p = &slowPruner{rows: 1000, work: time.Millisecond}
	n, err = Prune(ctx, p, time.Now(), PruneOptions{Batch: 10, Duty: 1, Progress: func(int) { cancel() }})
	if !errors.Is(err, context.Canceled) || n != 10 {
		t.Fatalf("Prune cancelled after its first batch = %d, %v; want 10, context.Canceled", n, err)
	}
}
