package sqlstore

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
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
