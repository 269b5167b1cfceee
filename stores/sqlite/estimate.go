package sqlite

import (
	"context"

	"github.com/idemq/idemq/admin"
)

var _ admin.Estimator = (*Store)(nil)

// Estimate estimates the dedup table's rows and size (admin.Estimator).
// SQLite keeps no row statistics unless ANALYZE runs, so Estimate counts
// the rows up to admin.CountCap, reading at most that many index entries;
// its size is the whole database file's (page_count × page_size, the
// lease table and any other tables included), which SQLite knows without
// reading the pages, unlike the dbstat table Inspect reads.
func (s *Store) Estimate(ctx context.Context) (admin.TableEstimate, error) {
	e := admin.TableEstimate{Table: s.cfg.Table, SizeSource: "the whole database file (page_count × page_size)"}
	wrap := func(err error) error { return s.cfg.Wrap("estimate", err) }
	var n int64
	if err := s.DB().QueryRowContext(ctx, admin.BoundedCountSQL(s.cfg.Table, admin.CountCap)).Scan(&n); err != nil {
		return e, wrap(err)
	}
	admin.CappedCount(&e, n, admin.CountCap)
	e.RowsSource = admin.CountedUpTo(admin.CountCap)
	if err := s.DB().QueryRowContext(ctx, `SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()`).Scan(&e.SizeBytes); err != nil {
		return e, wrap(err)
	}
	return e, nil
}
