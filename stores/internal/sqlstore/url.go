package sqlstore

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/redact"
)

// URLParams reads a store's URL: the store's own parameters (Table), the
// database driver's that pass to it as they are (Driver), and any other
// the driver takes when written with Prefix ("pgx.timezone=UTC" passes
// "timezone=UTC"): a parameter none of these name is refused, named, with
// the nearest known name, so a typo fails at start-up instead of reaching
// the database.
type URLParams[O any] struct {
	urlparam.Table[O]
	// Driver are the driver's parameters that pass as they are.
	Driver []string
	// Prefix marks any other parameter for the driver; "" passes none.
	Prefix string
	// PrefixFor says what a prefixed parameter is for, in the error of an
	// unknown one: "a server runtime parameter".
	PrefixFor string
}

// Split splits u into the store's options and the URL the driver gets:
// u without them, and with the prefix taken off the prefixed parameters.
// Of a repeated parameter of the store, the first value counts.
func (p URLParams[O]) Split(u *url.URL) (string, []O, error) {
	q, err := redact.ParseQuery(u.RawQuery) // u.Query() would drop a pair with a ';' silently
	if err != nil {
		return "", nil, fmt.Errorf("%s URL parameters: %w", p.Scheme, err)
	}
	opts, err := p.Take(q)
	if err != nil {
		return "", nil, err
	}
	pass := url.Values{}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		switch name, prefixed := strings.CutPrefix(k, p.Prefix); {
		case slices.Contains(p.Driver, k):
			pass[k] = q[k]
		case p.Prefix != "" && prefixed && name != "":
			pass[name] = q[k]
		default:
			err := p.Unknown(k, p.Driver...)
			if p.Prefix != "" {
				err = fmt.Errorf("%w; %s goes as %sNAME=value", err, p.PrefixFor, p.Prefix)
			}
			return "", nil, err
		}
	}
	rest := *u
	rest.RawQuery = pass.Encode()
	return rest.String(), opts, nil
}

// Params are a store's URL parameters: table and retention, which every
// SQL store takes for WithTable and WithRetention, added to more, the
// store's own.
func Params[O any](withTable func(string) O, withRetention func(time.Duration) O, more map[string]urlparam.Param[O]) map[string]urlparam.Param[O] {
	more["table"] = urlparam.Text("WithTable", withTable)
	more["retention"] = urlparam.Duration("WithRetention", withRetention)
	return more
}

// Opener is what a store registers with driver.RegisterStore: it reads the
// URL with parse, without connecting, then opens the store with open.
func Opener[O, S any](parse func(*url.URL) (string, []O, error), open func(context.Context, string, ...O) (S, error)) func(context.Context, *url.URL) (any, error) {
	return func(ctx context.Context, u *url.URL) (any, error) {
		conn, opts, err := parse(u)
		if err != nil {
			return nil, err
		}
		return open(ctx, conn, opts...)
	}
}
