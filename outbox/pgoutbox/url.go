package pgoutbox

import (
	"context"
	"net/url"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/internal/sqloutbox"
)

// The schemes admin.OpenOutbox opens with this package imported.
func init() {
	admin.RegisterOutbox("postgres", openTable)
	admin.RegisterOutbox("postgresql", openTable)
}

// openTable opens the outbox table named table (DefaultTable when "") in
// the database at u, a pgx connection string.
func openTable(ctx context.Context, u *url.URL, table string) (admin.OutboxTable, error) {
	return sqloutbox.OpenTable(table, DefaultTable, func(t string) (*Outbox, error) { return New(WithTable(t)) },
		func(ob *Outbox) (outbox.Operator, func() error, error) {
			pool, err := pgxpool.New(ctx, u.String())
			if err != nil {
				return nil, nil, err
			}
			return ob.Store(pool), func() error { pool.Close(); return nil }, nil
		})
}
