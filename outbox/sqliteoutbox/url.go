package sqliteoutbox

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/internal/sqloutbox"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// The scheme admin.OpenOutbox opens with this package imported.
func init() { admin.RegisterOutbox("sqlite", openTable) }

// openTable opens the outbox table named table (DefaultTable when "") in
// the SQLite database file at u, sqlite://path. The file must exist: an
// operator's typo must not create an empty database.
func openTable(ctx context.Context, u *url.URL, table string) (admin.OutboxTable, error) {
	path := u.Host + u.Path
	if u.Opaque != "" {
		path = u.Opaque
	}
	for k := range u.Query() {
		return nil, fmt.Errorf("%w: sqlite URL: unknown parameter %q (known: table)", admin.ErrBadURL, redact.Name(k))
	}
	if path == "" || strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("%w: a sqlite URL is sqlite://path/to/app.db", admin.ErrBadURL)
	}
	return sqloutbox.OpenTable(table, DefaultTable, func(t string) (*Outbox, error) { return New(WithTable(t)) },
		func(ob *Outbox) (outbox.Operator, func() error, error) {
			if _, err := os.Stat(path); err != nil {
				return nil, nil, err
			}
			db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_txlock=immediate")
			if err != nil {
				return nil, nil, err
			}
			return ob.Store(db), db.Close, nil
		})
}
