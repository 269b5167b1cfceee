package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemq/idemq/admin"
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
	// Duty paces each round's batches (admin.PruneOptions.Duty). Default
	// admin.DefaultPruneDuty.
	Duty float64
}

// RunPruner deletes claims older than s.Retention every s.Every: each round
// is one admin.Prune, batch by batch and paced by s.Duty. It returns ctx's
// error when ctx is done; a failed round is logged and retried at the next
// tick.
func RunPruner(ctx context.Context, p admin.Pruner, s PruneSchedule) error {
	switch {
	case s.Every <= 0:
		return fmt.Errorf("RunPruner: PruneSchedule.Every must be positive, got %v", s.Every)
	case s.Retention <= 0:
		return fmt.Errorf("RunPruner: PruneSchedule.Retention must be positive, got %v", s.Retention)
	case s.Batch <= 0:
		return fmt.Errorf("RunPruner: PruneSchedule.Batch must be positive, got %d", s.Batch)
	case s.Duty != 0 && !(s.Duty > 0 && s.Duty <= 1):
		return fmt.Errorf("RunPruner: PruneSchedule.Duty must be in (0, 1], got %v", s.Duty)
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
		total, err := admin.Prune(ctx, p, cut, admin.PruneOptions{Batch: s.Batch, Duty: s.Duty})
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
