package sqlite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemq/idemq/core"
)

// runPruner is RunPruner's loop: every tick it prunes rows older than
// now-retention, batch by batch, so no single DELETE holds locks long.
func runPruner(ctx context.Context, p core.Pruner, now func() time.Time, retention time.Duration, table string, every time.Duration, batch int, logger *slog.Logger) error {
	if every <= 0 {
		return fmt.Errorf("RunPruner: every must be positive, got %v", every)
	}
	if batch <= 0 {
		return fmt.Errorf("RunPruner: batch must be positive, got %d", batch)
	}
	if logger == nil {
		logger = slog.Default()
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		cut := now().Add(-retention)
		total := 0
		for ctx.Err() == nil {
			n, err := p.Prune(ctx, cut, batch)
			total += n
			if err != nil {
				if !errors.Is(err, ctx.Err()) {
					logger.WarnContext(ctx, "idemq: prune failed", "table", table, "err", err)
				}
				break
			}
			if n < batch {
				break
			}
		}
		if total > 0 {
			logger.InfoContext(ctx, "idemq: pruned claims", "table", table, "rows", total, "before", cut)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
