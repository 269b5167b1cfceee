package mysql

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemq/idemq/core"
)

// runPruner is RunPruner's loop: core.RunPruner with the store's clock,
// retention and table.
func runPruner(ctx context.Context, p core.Pruner, now func() time.Time, retention time.Duration, table string, every time.Duration, batch int, logger *slog.Logger) error {
	return core.RunPruner(ctx, p, core.PruneSchedule{Every: every, Batch: batch, Retention: retention, Now: now, Logger: logger, Table: table})
}
