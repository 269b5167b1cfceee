package mysql

import (
	"database/sql"
	"net/url"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// The scheme core.OpenStore[*sql.Tx] opens with this package imported.
// The store opens "mysql://user:pass@host:3306/db?table=NAME&retention=168h&isolation=read-committed&…":
// table, retention, isolation (read-committed, repeatable-read,
// serializable) and migrate are the store's options; every other parameter
// goes to the driver (tls, timeout, …). tls=true, skip-verify, preferred,
// or the name of a config registered with RegisterTLSCA or the driver's
// RegisterTLSConfig.
func init() { driver.RegisterStore("mysql", sqlstore.Opener(parseURL, Open)) }

// parseURL splits a mysql:// URL into the store's options and the URL the
// driver gets (the rest), without connecting, so the parser can be fuzzed
// alone.
func parseURL(u *url.URL) (string, []Option, error) { return urlParams.Split(u) }

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
