package mysql

import (
	"database/sql"
	"net/url"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// The scheme core.OpenStore[*sql.Tx] opens with this package imported.
// The store opens "mysql://user:pass@host:3306/db?table=NAME&retention=168h&isolation=read-committed&…":
// table, retention, isolation (read-committed, repeatable-read,
// serializable), migrate and pool_max_conns are the store's options; go-sql-driver's own
// parameters go to the driver (tls, timeout, parseTime, …), a session
// system variable written as mysql.NAME (mysql.time_zone='+00:00'), and a
// parameter none of these name is refused, named. tls=true, skip-verify, preferred,
// or the name of a config registered with RegisterTLSCA or the driver's
// RegisterTLSConfig.
func init() { driver.RegisterStore("mysql", sqlstore.Opener(parseURL, Open)) }

// parseURL splits a mysql:// URL into the store's options and the URL the
// driver gets (the rest), without connecting, so the parser can be fuzzed
// alone.
func parseURL(u *url.URL) (string, []Option, error) { return urlParams.Split(u) }

// urlParams are the store's options a mysql:// URL sets.
var urlParams = sqlstore.URLParams[Option]{
	Table: urlparam.Table[Option]{Scheme: "mysql", Params: sqlstore.Params(WithTable, WithRetention, map[string]urlparam.Param[Option]{
		"migrate":        urlparam.Bool("WithMigrate", WithMigrate),
		"pool_max_conns": urlparam.Int("WithMaxConns", WithMaxConns),
		"isolation": urlparam.Choice("WithIsolation", map[string]Option{
			"read-committed":  WithIsolation(sql.LevelReadCommitted),
			"repeatable-read": WithIsolation(sql.LevelRepeatableRead),
			"serializable":    WithIsolation(sql.LevelSerializable),
		}),
	})},
	Driver: []string{
		"tls", "ssl-ca", "ssl-cert", "ssl-key", "ssl-server-name",
		"timeout", "readTimeout", "writeTimeout", "charset", "collation", "loc", "parseTime",
		"timeTruncate", "maxAllowedPacket", "interpolateParams", "multiStatements", "rejectReadOnly",
		"serverPubKey", "clientFoundRows", "columnsWithAlias", "checkConnLiveness", "compress",
		"connectionAttributes", "allowAllFiles", "allowCleartextPasswords", "allowFallbackToPlaintext",
		"allowNativePasswords", "allowOldPasswords",
	},
	Prefix:    "mysql.",
	PrefixFor: "a session system variable (mysql.time_zone='+00:00')",
}
