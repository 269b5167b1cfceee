package mysql

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// runPruner is RunPruner's loop: driver.RunPruner with the store's clock,
// retention and table.
func runPruner(ctx context.Context, p driver.Pruner, now func() time.Time, retention time.Duration, table string, every time.Duration, batch int, logger *slog.Logger) error {
	return driver.RunPruner(ctx, p, driver.PruneSchedule{Every: every, Batch: batch, Retention: retention, Now: now, Logger: logger, Table: table})
}
