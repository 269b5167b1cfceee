package benchmark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/idemq/idemq/admin"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/core"
)

// memorySizes are the queue depths the memory scenario compares (10,000
// against 1,000,000). Tests shrink them.
var memorySizes = [2]int{10_000, 1_000_000}

// memoryScenario queues memorySizes[0], then memorySizes[1] unique
// messages and consumes each backlog with the idemq batch consumer,
// recording peak RSS: with the window bounding what is in flight, it must
// not grow with the queue's depth.
func (s *session) memoryScenario(ctx context.Context, rep *Report) error {
	for i, n := range memorySizes {
		name := MemoryScenario + "/10k"
		if i == 1 {
			name = MemoryScenario + "/1m"
		}
		r := &Result{Name: name, Description: fmt.Sprintf("idemq batch %d × %d worker(s), %d messages queued before it starts", s.cfg.BatchSize, s.cfg.BatchWorkers, n)}
		rep.Results = append(rep.Results, r)
		s.progress("[%s] %d messages queued, idemq batch", name, n)
		run := s.runOne(ctx, name, runSpec{n: n})
		s.progress("    %s", run.line())
		r.Runs = append(r.Runs, run)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// quietPaced is how long the growth scenario's quiet paced phase lasts
// (about as long as pruning 10M rows takes). Tests shorten it.
var quietPaced = 60 * time.Second

// growthScenario compares idemq batch throughput on an empty dedup table
// with the same on a table already holding Config.GrowthRows old rows (of
// another consumer, 30 days old), then measures the paced p99 while those
// rows are pruned the way a store's RunPruner does it (Config.PruneBatch rows a
// statement, resting between statements) against the p99 of a paced phase
// as long on the full table with nothing else running.
func (s *session) growthScenario(ctx context.Context, rep *Report) error {
	rows := s.cfg.GrowthRows
	pg, ok := s.store.(*pgStore)
	if !ok {
		err := errors.New("the growth scenario supports only Postgres stores so far")
		rep.Results = append(rep.Results, &Result{Name: GrowthScenario, Description: Describe(GrowthScenario), Runs: []RunResult{{Error: err.Error()}}})
		return err
	}
	empty := &Result{Name: GrowthScenario + "/empty", Description: "idemq batch on an empty dedup table"}
	full := &Result{Name: GrowthScenario + "/full", Description: fmt.Sprintf("idemq batch with %d rows already in the dedup table", rows)}
	quiet := &Result{Name: GrowthScenario + "/quiet", Description: fmt.Sprintf("paced latency for %s on the full table, nothing else running", quietPaced)}
	prune := &Result{Name: GrowthScenario + "/prune", Description: fmt.Sprintf("paced latency while a admin.Prune round deletes those %d rows (batches of %d, duty %.2f)", rows, s.cfg.PruneBatch, s.cfg.PruneDuty)}
	rep.Results = append(rep.Results, empty, full, quiet, prune)
	spec := runSpec{n: s.cfg.N, dups: s.cfg.duplicates(), paced: s.cfg.LatencyMessages}

	table := "bench_growth_" + randHex(5)
	defer pg.dropTable(context.WithoutCancel(ctx), table)
	start := time.Now()
	s.progress("[%s] filling %s with %d rows", full.Name, table, rows)
	if err := pg.fill(ctx, table, rows); err != nil {
		err = fmt.Errorf("filling %s: %w", table, err)
		full.Runs = append(full.Runs, RunResult{Error: err.Error()})
		prune.Runs = append(prune.Runs, RunResult{Error: err.Error()})
		return err
	}
	s.progress("    filled in %.0fs", time.Since(start).Seconds())

	// Interleaved, as the main configurations are.
	for rnd := 1; rnd <= s.cfg.Repeat; rnd++ {
		for _, r := range []*Result{empty, full} {
			sp := spec
			if r == full {
				sp.dedupTable = table
			}
			s.progress("[%s] run %d of %d", r.Name, rnd, s.cfg.Repeat)
			run := s.runOne(ctx, r.Name, sp)
			s.progress("    %s", run.line())
			r.Runs = append(r.Runs, run)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}

	// The quiet figure the prune's is held against: as long a paced phase
	// as a prune takes, so both see the machine's rare hiccups alike.
	s.progress("[%s] paced for %s", quiet.Name, quietPaced)
	run := s.runOne(ctx, quiet.Name, runSpec{paced: max(1, int(float64(s.cfg.LatencyRate)*quietPaced.Seconds())), dedupTable: table})
	s.progress("    %s", run.line())
	quiet.Runs = append(quiet.Runs, run)
	if ctx.Err() != nil {
		return ctx.Err()
	}

	// Paced messages for as long as the prune runs (at most 10 minutes).
	var pruned int
	var pruneTime time.Duration
	sp := runSpec{n: 0, paced: s.cfg.LatencyRate * 600, dedupTable: table}
	sp.whilePaced = func(ctx context.Context) error {
		store, err := core.OpenStore[pgx.Tx](ctx, pg.idemqStoreURL(table, 2))
		if err != nil {
			return err
		}
		if c, ok := store.(io.Closer); ok {
			defer c.Close()
		}
		p, ok := store.(admin.Pruner)
		if !ok {
			return errors.New("the store does not implement admin.Pruner")
		}
		t0 := time.Now()
		// The way a service prunes: one of its RunPruner's rounds.
		n, err := admin.Prune(ctx, p, time.Now().Add(-24*time.Hour), admin.PruneOptions{Batch: s.cfg.PruneBatch, Duty: s.cfg.PruneDuty})
		pruned, pruneTime = n, time.Since(t0)
		return err
	}
	s.progress("[%s] pruning %d rows while publishing at %d msg/s", prune.Name, rows, s.cfg.LatencyRate)
	run = s.runOne(ctx, prune.Name, sp)
	if run.Error == "" && pruned < rows {
		run.Error = fmt.Sprintf("the prune removed %d of %d rows", pruned, rows)
	}
	s.progress("    %s; pruned %d rows in %.1fs", run.line(), pruned, pruneTime.Seconds())
	prune.Runs = append(prune.Runs, run)
	return nil
}
