package admin

import (
	"context"
	"fmt"
	"time"
)

// Pruner is implemented by stores that can delete old claims. Prune removes
// at most limit claims recorded before the given time, in one short
// transaction, and returns how many it removed; callers loop until it
// returns fewer than limit, so no giant DELETE ever holds a long lock.
// Prune never removes a lease that has not expired.
type Pruner interface {
	Prune(ctx context.Context, before time.Time, limit int) (int, error)
}

// PruneOptions says how Prune paces its batches.
type PruneOptions struct {
	// Batch is how many claims one statement deletes at most. Required.
	Batch int
	// Duty is the fraction of the time spent deleting: after a batch that
	// took d, Prune rests d×(1−Duty)/Duty before the next one, so the pace
	// follows what the database can spare instead of a fixed rate that a
	// busy table could outgrow. 1 deletes back to back. Default
	// DefaultPruneDuty.
	Duty float64
	// Pause is a fixed rest between two batches, on top of Duty's.
	// Default 0.
	Pause time.Duration
	// Progress, when not nil, is called after each batch with the number
	// of claims it deleted.
	Progress func(deleted int)
}

// DefaultPruneDuty is PruneOptions.Duty's default: Prune rests three times
// as long as each batch took, which keeps its write-ahead log and dirty
// pages from crowding the consumers' commit flushes on a busy database.
const DefaultPruneDuty = 0.25

func (o PruneOptions) withDefaults() (PruneOptions, error) {
	if o.Batch <= 0 {
		return o, fmt.Errorf("PruneOptions.Batch must be positive, got %d", o.Batch)
	}
	if o.Duty == 0 {
		o.Duty = DefaultPruneDuty
	}
	if !(o.Duty > 0 && o.Duty <= 1) {
		return o, fmt.Errorf("PruneOptions.Duty must be in (0, 1], got %v", o.Duty)
	}
	if o.Pause < 0 {
		return o, fmt.Errorf("PruneOptions.Pause must not be negative, got %v", o.Pause)
	}
	return o, nil
}

// Prune deletes every claim p holds that was recorded before before, in
// batches of o.Batch rows (each its own short statement, so no DELETE
// holds locks for long) until a batch comes back short, resting between
// batches as o says. It returns how many claims it deleted; after an
// error, or when ctx ends, those were deleted and the rest are kept. The
// stores' RunPruner runs it at every tick; idemq prune runs it once.
func Prune(ctx context.Context, p Pruner, before time.Time, o PruneOptions) (int, error) {
	o, err := o.withDefaults()
	if err != nil {
		return 0, fmt.Errorf("prune: %w", err)
	}
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		start := time.Now()
		n, err := p.Prune(ctx, before, o.Batch)
		total += n
		if err == nil && o.Progress != nil {
			o.Progress(n)
		}
		if err != nil || n < o.Batch {
			return total, err
		}
		rest := time.Duration(float64(time.Since(start))*(1-o.Duty)/o.Duty) + o.Pause
		t := time.NewTimer(rest)
		select {
		case <-ctx.Done():
			t.Stop()
			return total, ctx.Err()
		case <-t.C:
		}
	}
}
