package mysqloutbox

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/outbox/internal/sqloutbox"
	"github.com/idemq/idemq/stores/mysql"
)

// The scheme admin.OpenOutbox opens with this package imported.
func init() { admin.RegisterOutbox("mysql", openTable) }

// openTable opens the outbox table named table (DefaultTable when "") in
// the database at u, a mysql:// URL as the MySQL store takes it.
func openTable(ctx context.Context, u *url.URL, table string) (admin.OutboxTable, error) {
	if table == "" {
		table = DefaultTable
	}
	ob, err := New(WithTable(table))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", admin.ErrBadURL, err)
	}
	cfg, err := mysql.ParseDSN(u.String())
	if err != nil {
		return nil, err
	}
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	return &sqloutbox.Opened{Operator: ob.Store(db), Name: table, CloseDB: db.Close}, nil
}
