package sqlite

import (
	"context"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// Estimate estimates the dedup table's rows and size (admin.Estimator).
// SQLite keeps no row statistics unless ANALYZE runs, so Estimate counts
// the rows up to admin.CountCap, reading at most that many index entries;
// its size is the whole database file's (page_count × page_size, the
// lease table and any other tables included), which SQLite knows without
// reading the pages, unlike the dbstat table Inspect reads.
func (s *Store) Estimate(ctx context.Context) (admin.TableEstimate, error) {
	e := admin.TableEstimate{Table: s.cfg.Table, SizeSource: "the whole database file (page_count × page_size)"}
	err := sqlstore.CountRows(&e, "", func(q string) sqlstore.Row { return s.DB().QueryRowContext(ctx, q) })
	if err == nil {
		err = s.DB().QueryRowContext(ctx, `SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()`).Scan(&e.SizeBytes)
	}
	if err != nil {
		return e, s.cfg.Wrap("estimate", err)
	}
	return e, nil
}
