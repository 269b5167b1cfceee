package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// The scheme core.OpenStore[*sql.Tx] opens with this package imported.
func init() { driver.RegisterStore("mysql", openURL) }

// openURL opens "mysql://user:pass@host:3306/db?table=NAME&retention=168h&isolation=read-committed&…":
// table, retention, isolation (read-committed, repeatable-read,
// serializable) and migrate are the store's options; every other parameter
// goes to the driver (tls, timeout, …). tls=true, skip-verify, preferred,
// or the name of a config registered with RegisterTLSCA or the driver's
// RegisterTLSConfig.
func openURL(ctx context.Context, u *url.URL) (any, error) {
	conn, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return Open(ctx, conn, opts...)
}

// parseURL splits a mysql:// URL into the store's options and the URL the
// driver gets (the rest), without connecting, so the parser can be fuzzed
// alone.
func parseURL(u *url.URL) (string, []Option, error) {
	q, err := redact.ParseQuery(u.RawQuery) // u.Query() would drop a pair with a ';' silently
	if err != nil {
		return "", nil, fmt.Errorf("mysql URL parameters: %w", err)
	}
	opts, err := urlParams.Take(q)
	if err != nil {
		return "", nil, err
	}
	rest := *u
	rest.RawQuery = q.Encode()
	return rest.String(), opts, nil
}

// urlParams are the store's options a mysql:// URL sets.
var urlParams = sqlstore.URLParams[Option]{
	Store:     "mysql",
	Strings:   map[string]func(string) Option{"table": WithTable},
	Durations: map[string]func(time.Duration) Option{"retention": WithRetention},
	Bools:     map[string]func(bool) Option{"migrate": WithMigrate},
	Choices: map[string]map[string]Option{"isolation": {
		"read-committed":  WithIsolation(sql.LevelReadCommitted),
		"repeatable-read": WithIsolation(sql.LevelRepeatableRead),
		"serializable":    WithIsolation(sql.LevelSerializable),
	}},
}
