package mysql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// Estimate estimates the dedup table's rows and size (admin.Estimator)
// from information_schema.TABLES: TABLE_ROWS, which for InnoDB is an
// estimate its statistics keep (sampled, off by up to tens of percent,
// refreshed as rows change and by ANALYZE TABLE; MySQL 8 caches it for
// information_schema_stats_expiry), and DATA_LENGTH + INDEX_LENGTH, as
// Inspect reports them. When the server gives no TABLE_ROWS, Estimate
// counts the rows instead, up to admin.CountCap. Every query is bounded
// whatever the table's size.
func (s *Store) Estimate(ctx context.Context) (admin.TableEstimate, error) {
	e := admin.TableEstimate{Table: s.cfg.Table, SizeSource: "information_schema.TABLES DATA_LENGTH + INDEX_LENGTH"}
	wrap := func(err error) error { return s.cfg.Wrap("estimate", err) }
	var rows, size sql.NullInt64
	var engine sql.NullString
	err := s.DB().QueryRowContext(ctx, `SELECT table_rows, COALESCE(data_length, 0) + COALESCE(index_length, 0), engine
FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`, s.cfg.Table).Scan(&rows, &size, &engine)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return e, wrap(err)
	}
	e.SizeBytes = size.Int64
	if rows.Valid {
		e.Rows = rows.Int64
		switch engine.String {
		case "InnoDB", "":
			e.RowsSource = "InnoDB estimate (information_schema.TABLES.TABLE_ROWS), refreshed as rows change and by ANALYZE TABLE"
		default:
			e.RowsSource = engine.String + " figure (information_schema.TABLES.TABLE_ROWS)"
		}
		return e, nil
	}
	if err := sqlstore.CountRows(&e, " (information_schema.TABLES gives no TABLE_ROWS)", func(q string) sqlstore.Row { return s.DB().QueryRowContext(ctx, q) }); err != nil {
		return e, wrap(err)
	}
	return e, nil
}
