package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/internal/redact"
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
	var opts []Option
	for _, k := range []string{"table", "retention", "partitions"} {
		if !q.Has(k) {
			continue
		}
		v := q.Get(k)
		q.Del(k)
		if k == "table" {
			opts = append(opts, WithTable(v))
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return "", nil, fmt.Errorf("postgres URL parameter %s: not a duration like 168h", k)
		}
		if k == "retention" {
			opts = append(opts, WithRetention(d))
		} else {
			opts = append(opts, WithPartitions(d))
		}
	}
	if q.Has("migrate") {
		v := q.Get("migrate")
		on, err := strconv.ParseBool(v)
		if err != nil {
			return "", nil, errors.New("postgres URL parameter migrate: not true or false")
		}
		opts = append(opts, WithMigrate(on))
		q.Del("migrate")
	}
	rest := *u
	rest.RawQuery = q.Encode()
	return rest.String(), opts, nil
}
