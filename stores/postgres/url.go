package postgres

import (
	"net/url"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// The schemes core.OpenStore[pgx.Tx] opens with this package imported.
// The store opens "postgres://user:pass@host:5432/db?table=NAME&retention=168h&partitions=24h&sslmode=…":
// table, retention, partitions and migrate are the store's options
// (WithTable, WithRetention, WithPartitions, WithMigrate); pgx's own
// parameters go to pgxpool (sslmode up to verify-full, sslrootcert,
// sslcert, sslkey, sslpassword, sslsni, pool_max_conns, application_name,
// search_path, target_session_attrs, connect_timeout, …), any other
// parameter of pgx or of the server written as pgx.NAME (pgx.timezone=UTC
// sets the session's timezone), and a parameter none of these name is
// refused, named. Several hosts, as in
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

// urlParams are the store's options a postgres:// URL sets, and the
// parameters pgx takes.
var urlParams = sqlstore.URLParams[Option]{
	Table: urlparam.Table[Option]{Scheme: "postgres", Params: sqlstore.Params(WithTable, WithRetention, map[string]urlparam.Param[Option]{
		"partitions": urlparam.Duration("WithPartitions", WithPartitions),
		"migrate":    urlparam.Bool("WithMigrate", WithMigrate),
	})},
	Driver: []string{
		"sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslsni", "sslnegotiation",
		"connect_timeout", "target_session_attrs", "application_name", "search_path", "options",
		"passfile", "service", "servicefile", "krbsrvname", "krbspn", "channel_binding", "client_encoding",
		"pool_max_conns", "pool_min_conns", "pool_min_idle_conns", "pool_max_conn_lifetime",
		"pool_max_conn_lifetime_jitter", "pool_max_conn_idle_time", "pool_health_check_period",
		"statement_cache_capacity", "description_cache_capacity", "default_query_exec_mode",
	},
	Prefix:    "pgx.",
	PrefixFor: "any other pgx connection or server runtime parameter",
}
