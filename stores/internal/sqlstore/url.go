package sqlstore

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/internal/redact"
)

// URLParams names the query parameters of a store's URL that are the
// store's options (the rest go to the driver, or are refused), and the
// option each value gives.
type URLParams[O any] struct {
	// Store prefixes errors: "mysql URL parameter retention: …".
	Store string
	// Strings take the value as it is (table).
	Strings map[string]func(string) O
	// Durations take a time.ParseDuration value (retention, …).
	Durations map[string]func(time.Duration) O
	// Bools take a strconv.ParseBool value (migrate).
	Bools map[string]func(bool) O
	// Choices take one of a fixed set of words (isolation).
	Choices map[string]map[string]O
}

// Take removes the parameters p names from q and returns the options they
// give, in the order of their names. A repeated parameter's first value
// counts. Errors name the parameter and never quote its value.
func (p URLParams[O]) Take(q url.Values) ([]O, error) {
	var opts []O
	for _, k := range slices.Sorted(maps.Keys(q)) {
		v := q.Get(k)
		var o O
		if f, ok := p.Strings[k]; ok {
			o = f(v)
		} else if f, ok := p.Durations[k]; ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				return nil, fmt.Errorf("%s URL parameter %s: not a duration like 168h", p.Store, k)
			}
			o = f(d)
		} else if f, ok := p.Bools[k]; ok {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, fmt.Errorf("%s URL parameter %s: not true or false", p.Store, k)
			}
			o = f(b)
		} else if words, ok := p.Choices[k]; ok {
			if o, ok = words[v]; !ok {
				return nil, fmt.Errorf("%s URL parameter %s: not %s", p.Store, k, oneOf(slices.Sorted(maps.Keys(words))))
			}
		} else {
			continue
		}
		opts = append(opts, o)
		q.Del(k)
	}
	return opts, nil
}

// oneOf writes words as "a, b or c".
func oneOf(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// Split splits u into the store's options and the URL the driver gets:
// u without them.
func (p URLParams[O]) Split(u *url.URL) (string, []O, error) {
	q, err := redact.ParseQuery(u.RawQuery) // u.Query() would drop a pair with a ';' silently
	if err != nil {
		return "", nil, fmt.Errorf("%s URL parameters: %w", p.Store, err)
	}
	opts, err := p.Take(q)
	if err != nil {
		return "", nil, err
	}
	rest := *u
	rest.RawQuery = q.Encode()
	return rest.String(), opts, nil
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
