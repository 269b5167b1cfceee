package postgres

import (
	"net/url"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// The schemes core.OpenStore[pgx.Tx] opens with this package imported.
// The store opens "postgres://user:pass@host:5432/db?table=NAME&retention=168h&partitions=24h&sslmode=…":
// table, retention, partitions and migrate are the store's options
// (WithTable, WithRetention, WithPartitions, WithMigrate); every other
// parameter goes to pgxpool (sslmode up to verify-full, sslrootcert,
// sslcert, sslkey, sslpassword, sslsni, pool_max_conns, application_name,
// target_session_attrs, connect_timeout, …). Several hosts, as in
// "postgres://user@db1:5432,db2:5432/db?target_session_attrs=read-write",
// pass to pgx too, which connects to the first that takes writes (see the
// package documentation on failover); the list may hold IPv6 literals
// ("[::1]:5432,[::1]:5433") and hosts without a port.
func init() {
	openURL := sqlstore.Opener(parseURL, Open)
	driver.RegisterStore("postgres", openURL)
	driver.RegisterStore("postgresql", openURL)
}

// parseURL splits a postgres:// URL into the store's options and the URL the
// driver gets (the rest), without connecting, so the parser can be fuzzed
// alone.
func parseURL(u *url.URL) (string, []Option, error) { return urlParams.Split(u) }

// urlParams are the store's options a postgres:// URL sets.
var urlParams = sqlstore.URLParams[Option]{
	Store:     "postgres",
	Strings:   map[string]func(string) Option{"table": WithTable},
	Durations: map[string]func(time.Duration) Option{"retention": WithRetention, "partitions": WithPartitions},
	Bools:     map[string]func(bool) Option{"migrate": WithMigrate},
}
