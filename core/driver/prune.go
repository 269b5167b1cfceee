package driver

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
	// Duty is the fraction of a round's time spent deleting: after a batch
	// that took d, the round rests d×(1−Duty)/Duty before the next one, so
	// the pace follows what the database can spare instead of a fixed
	// rate that a busy table could outgrow. 1 deletes back to back.
	// Default DefaultPruneDuty.
	Duty float64
}

// DefaultPruneDuty is PruneSchedule.Duty's default: a round rests three
// times as long as each batch took. Pruning 10M rows beside a paced
// consumer on 2 cores, a duty of 1/2 raised the consumer's p99 decision
// latency 2.35× (each batch's WAL and dirty pages queue in front of
// the consumers' commit flushes); see the README's Performance section.
const DefaultPruneDuty = 0.25

// withDefaults checks s's optional fields and fills in their defaults.
func (s PruneSchedule) withDefaults() (PruneSchedule, error) {
	if s.Batch <= 0 {
		return s, fmt.Errorf("PruneSchedule.Batch must be positive, got %d", s.Batch)
	}
	if s.Duty == 0 {
		s.Duty = DefaultPruneDuty
	}
	if !(s.Duty > 0 && s.Duty <= 1) {
		return s, fmt.Errorf("PruneSchedule.Duty must be in (0, 1], got %v", s.Duty)
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	return s, nil
}

// RunPruner deletes claims older than s.Retention every s.Every, in
// batches of s.Batch rows (each its own short statement, so no DELETE holds
// locks for long) until a batch comes back short. Between two batches of a
// round it rests in proportion to how long the last batch took (s.Duty): a
// backlog of millions of old claims is deleted at a fraction of one
// connection's pace instead of back to back, which keeps its write-ahead
// log flushes from crowding the consumers' commits (the p99 decision
// latency while 10M rows are pruned is the measure). It returns ctx's error when ctx is
// done; a failed round is logged and retried at the next tick. Stores'
// RunPruner methods call it.
func RunPruner(ctx context.Context, p Pruner, s PruneSchedule) error {
	if s.Every <= 0 {
		return fmt.Errorf("RunPruner: PruneSchedule.Every must be positive, got %v", s.Every)
	}
	if s.Retention <= 0 {
		return fmt.Errorf("RunPruner: PruneSchedule.Retention must be positive, got %v", s.Retention)
	}
	s, err := s.withDefaults()
	if err != nil {
		return fmt.Errorf("RunPruner: %w", err)
	}
	tick := time.NewTicker(s.Every)
	defer tick.Stop()
	for {
		cut := s.Now().Add(-s.Retention)
		total, err := pruneRound(ctx, p, cut, s.Batch, s.Duty)
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
// between batches in proportion to how long the last one took (duty).
func pruneRound(ctx context.Context, p Pruner, cut time.Time, batch int, duty float64) (int, error) {
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
		case <-time.After(time.Duration(float64(time.Since(start)) * (1 - duty) / duty)):
		}
	}
}

// PruneAll deletes every claim recorded before cut the way RunPruner's
// rounds do (batches of batch rows, resting between them at
// DefaultPruneDuty) and returns how many it deleted. It is for one-off
// clean-ups; a service runs RunPruner.
func PruneAll(ctx context.Context, p Pruner, cut time.Time, batch int) (int, error) {
	return PruneSchedule{Batch: batch}.Round(ctx, p, cut)
}

// Round deletes every claim recorded before cut as one of RunPruner's
// rounds does, with s.Batch and s.Duty (Every, Retention and Table are not
// used), and returns how many it deleted.
func (s PruneSchedule) Round(ctx context.Context, p Pruner, cut time.Time) (int, error) {
	s, err := s.withDefaults()
	if err != nil {
		return 0, fmt.Errorf("prune round: %w", err)
	}
	return pruneRound(ctx, p, cut, s.Batch, s.Duty)
}
