package mysqloutbox

import (
	"context"
	"database/sql"
	"net/url"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/internal/sqloutbox"
	"github.com/idemq/idemq/stores/mysql"
)

// The scheme admin.OpenOutbox opens with this package imported.
func init() { admin.RegisterOutbox("mysql", openTable) }

// openTable opens the outbox table named table (DefaultTable when "") in
// the database at u, a mysql:// URL as the MySQL store takes it.
func openTable(ctx context.Context, u *url.URL, table string) (admin.OutboxTable, error) {
	return sqloutbox.OpenTable(table, DefaultTable, func(t string) (*Outbox, error) { return New(WithTable(t)) },
		func(ob *Outbox) (outbox.Operator, func() error, error) {
			cfg, err := mysql.ParseDSN(u.String())
			if err != nil {
				return nil, nil, err
			}
			conn, err := mysqldrv.NewConnector(cfg)
			if err != nil {
				return nil, nil, err
			}
			db := sql.OpenDB(conn)
			return ob.Store(db), db.Close, nil
		})
}
