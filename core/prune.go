package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// PruneSchedule says how RunPruner deletes old claims from a store.
type PruneSchedule struct {
	// Every is how often a round starts. Required.
	Every time.Duration
	// Batch is how many rows one Prune call deletes at most. Required.
	Batch int
	// Retention is how long claims are kept: a round deletes those
	// recorded before now minus Retention. Required.
	Retention time.Duration
	// Now returns the current time. Default time.Now.
	Now func() time.Time
	// Logger receives a line per round that deleted rows, and failures.
	// Default slog.Default().
	Logger *slog.Logger
	// Table names the dedup table in log lines.
	Table string
}

// RunPruner deletes claims older than s.Retention every s.Every, in
// batches of s.Batch rows (each its own short statement, so no DELETE holds
// locks for long) until a batch comes back short. Between two batches of a
// round it rests as long as the last batch took: a backlog of millions of
// old claims is deleted at about half of one connection's pace instead of
// back to back, which keeps its write-ahead log flushes from crowding the
// consumers' commits (issue 10: p99 decision latency while 10M rows are
// pruned). It returns ctx's error when ctx is done; a failed round is
// logged and retried at the next tick. Stores' RunPruner methods call it.
func RunPruner(ctx context.Context, p Pruner, s PruneSchedule) error {
	if s.Every <= 0 {
		return fmt.Errorf("RunPruner: PruneSchedule.Every must be positive, got %v", s.Every)
	}
	if s.Batch <= 0 {
		return fmt.Errorf("RunPruner: PruneSchedule.Batch must be positive, got %d", s.Batch)
	}
	if s.Retention <= 0 {
		return fmt.Errorf("RunPruner: PruneSchedule.Retention must be positive, got %v", s.Retention)
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	tick := time.NewTicker(s.Every)
	defer tick.Stop()
	for {
		cut := s.Now().Add(-s.Retention)
		total, err := pruneRound(ctx, p, cut, s.Batch)
		if err != nil && !errors.Is(err, ctx.Err()) {
			s.Logger.WarnContext(ctx, "idemq: prune failed", "table", s.Table, "err", err)
		}
		if total > 0 {
			s.Logger.InfoContext(ctx, "idemq: pruned claims", "table", s.Table, "rows", total, "before", cut)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// pruneRound deletes claims recorded before cut, batch by batch, resting
// between batches as long as the last one took.
func pruneRound(ctx context.Context, p Pruner, cut time.Time, batch int) (int, error) {
	total := 0
	for {
		start := time.Now()
		n, err := p.Prune(ctx, cut, batch)
		total += n
		if err != nil || n < batch {
			return total, err
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(time.Since(start)):
		}
	}
}

// PruneAll deletes every claim recorded before cut the way RunPruner's
// rounds do (batches of batch rows, resting between them as long as the
// last took) and returns how many it deleted. It is for one-off clean-ups
// and the benchmark; a service runs RunPruner.
func PruneAll(ctx context.Context, p Pruner, cut time.Time, batch int) (int, error) {
	if batch <= 0 {
		return 0, fmt.Errorf("PruneAll: batch must be positive, got %d", batch)
	}
	return pruneRound(ctx, p, cut, batch)
}
