package postgres

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// The schemes core.OpenStore[pgx.Tx] opens with this package imported.
func init() {
	driver.RegisterStore("postgres", openURL)
	driver.RegisterStore("postgresql", openURL)
}

// openURL opens "postgres://user:pass@host:5432/db?table=NAME&retention=168h&partitions=24h&sslmode=…":
// table, retention, partitions and migrate are the store's options
// (WithTable, WithRetention, WithPartitions, WithMigrate); every other
// parameter goes to pgxpool (sslmode up to verify-full, sslrootcert,
// sslcert, sslkey, sslpassword, sslsni, pool_max_conns, application_name, …).
func openURL(ctx context.Context, u *url.URL) (any, error) {
	conn, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return Open(ctx, conn, opts...)
}

// parseURL splits a postgres:// URL into the store's options and the URL the
// driver gets (the rest), without connecting, so the parser can be fuzzed
// alone.
func parseURL(u *url.URL) (string, []Option, error) {
	q, err := redact.ParseQuery(u.RawQuery) // u.Query() would drop a pair with a ';' silently
	if err != nil {
		return "", nil, fmt.Errorf("postgres URL parameters: %w", err)
	}
	opts, err := urlParams.Take(q)
	if err != nil {
		return "", nil, err
	}
	rest := *u
	rest.RawQuery = q.Encode()
	return rest.String(), opts, nil
}

// urlParams are the store's options a postgres:// URL sets.
var urlParams = sqlstore.URLParams[Option]{
	Store:     "postgres",
	Strings:   map[string]func(string) Option{"table": WithTable},
	Durations: map[string]func(time.Duration) Option{"retention": WithRetention, "partitions": WithPartitions},
	Bools:     map[string]func(bool) Option{"migrate": WithMigrate},
}
