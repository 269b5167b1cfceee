package sqlite

import (
	"fmt"
	"net/url"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// The scheme core.OpenStore[*sql.Tx] opens with this package imported.
// The store opens "sqlite://PATH?table=NAME&retention=DURATION&busy_timeout=DURATION":
// sqlite://app.db is app.db in the working directory, sqlite:///var/lib/app.db
// an absolute path. Unknown parameters are refused, naming them.
func init() { driver.RegisterStore("sqlite", sqlstore.Opener(parseURL, Open)) }

// parseURL reads the file path and options of a sqlite:// URL, touching no
// file, so the parser can be fuzzed alone.
func parseURL(u *url.URL) (string, []Option, error) {
	path := u.Host + u.Path
	if u.Opaque != "" {
		path = u.Opaque
	}
	if path == "" {
		return "", nil, fmt.Errorf("sqlite URL has no file path (use sqlite://app.db or sqlite:///abs/path.db)")
	}
	query, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return "", nil, fmt.Errorf("sqlite URL parameters: %w", err)
	}
	for k, vs := range query {
		query[k] = vs[len(vs)-1:] // the last value counts
	}
	opts, err := urlParams.Read(query)
	if err != nil {
		return "", nil, err
	}
	return path, opts, nil
}

// urlParams are the store's options a sqlite:// URL sets.
var urlParams = urlparam.Table[Option]{Scheme: "sqlite", Params: sqlstore.Params(WithTable, WithRetention, map[string]urlparam.Param[Option]{
	"busy_timeout": urlparam.Duration("WithBusyTimeout", WithBusyTimeout),
})}
