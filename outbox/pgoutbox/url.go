package pgoutbox

import (
	"context"
	"fmt"
	"net/url"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/admin"
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
	if table == "" {
		table = DefaultTable
	}
	ob, err := New(WithTable(table))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", admin.ErrBadURL, err)
	}
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		return nil, err
	}
	return &sqloutbox.Opened{Operator: ob.Store(pool), Name: table, CloseDB: func() error { pool.Close(); return nil }}, nil
}
