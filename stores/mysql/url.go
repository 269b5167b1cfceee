package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/internal/redact"
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
	var opts []Option
	if q.Has("table") {
		opts = append(opts, WithTable(q.Get("table")))
		q.Del("table")
	}
	if q.Has("retention") {
		v := q.Get("retention")
		d, err := time.ParseDuration(v)
		if err != nil {
			return "", nil, errors.New("mysql URL parameter retention: not a duration like 168h")
		}
		opts = append(opts, WithRetention(d))
		q.Del("retention")
	}
	if q.Has("isolation") {
		levels := map[string]sql.IsolationLevel{
			"read-committed":  sql.LevelReadCommitted,
			"repeatable-read": sql.LevelRepeatableRead,
			"serializable":    sql.LevelSerializable,
		}
		v := q.Get("isolation")
		level, ok := levels[v]
		if !ok {
			return "", nil, errors.New("mysql URL parameter isolation: not read-committed, repeatable-read or serializable")
		}
		opts = append(opts, WithIsolation(level))
		q.Del("isolation")
	}
	if q.Has("migrate") {
		v := q.Get("migrate")
		on, err := strconv.ParseBool(v)
		if err != nil {
			return "", nil, errors.New("mysql URL parameter migrate: not true or false")
		}
		opts = append(opts, WithMigrate(on))
		q.Del("migrate")
	}
	rest := *u
	rest.RawQuery = q.Encode()
	return rest.String(), opts, nil
}
