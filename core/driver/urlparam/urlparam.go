// Package urlparam reads the query parameters of a source's, publisher's or
// store's URL into the options of its Go constructor: one table per scheme,
// one error style for every adapter. An error names the parameter the user
// wrote and never quotes its value (a value may be a secret); an unknown
// parameter is refused with the nearest known name ("did you mean") and
// the known ones. An adapter written outside this module uses it as the
// adapters of this one do.
package urlparam

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/internal/redact"
)

// Param is one parameter: the Go option it stands for and how its value
// becomes options.
type Param[O any] struct {
	// Option names the Go option the parameter sets ("WithAckWait"), so
	// that a constructor's error naming the option can be told in the
	// parameter's name (Table.Explain); "" for none.
	Option string
	// Read turns the value into options (none, for a parameter read
	// together with another), or says in a few words what it wants:
	// "not a duration like 30s".
	Read func(value string) ([]O, error)
}

// Text is a parameter whose value is taken as it is.
func Text[O any](option string, o func(string) O) Param[O] {
	return Param[O]{option, func(v string) ([]O, error) { return []O{o(v)}, nil }}
}

// NonEmpty is a Text parameter that refuses an empty value.
func NonEmpty[O any](option string, o func(string) O) Param[O] {
	return Param[O]{option, func(v string) ([]O, error) {
		if v == "" {
			return nil, errors.New("empty")
		}
		return []O{o(v)}, nil
	}}
}

// Bool is a parameter of strconv.ParseBool's values.
func Bool[O any](option string, o func(bool) O) Param[O] {
	return parsed(option, strconv.ParseBool, "not a boolean (true or false)", o)
}

// Int is a parameter of a whole number; the option checks its range.
func Int[O any](option string, o func(int) O) Param[O] {
	return parsed(option, strconv.Atoi, "not a number", o)
}

// Duration is a parameter of time.ParseDuration's values.
func Duration[O any](option string, o func(time.Duration) O) Param[O] {
	return parsed(option, time.ParseDuration, "not a duration like 30s or 168h", o)
}

// parsed is a parameter whose value parse reads; a value it refuses is
// what the error says, never quoted (it may be a secret).
func parsed[T, O any](option string, parse func(string) (T, error), what string, o func(T) O) Param[O] {
	return Param[O]{option, func(v string) ([]O, error) {
		x, err := parse(v)
		if err != nil {
			return nil, errors.New(what)
		}
		return []O{o(x)}, nil
	}}
}

// Choice is a parameter that takes one of a fixed set of words.
func Choice[O any](option string, words map[string]O) Param[O] {
	return Param[O]{option, func(v string) ([]O, error) {
		o, ok := words[v]
		if !ok {
			return nil, fmt.Errorf("not %s", oneOf(slices.Sorted(maps.Keys(words))))
		}
		return []O{o}, nil
	}}
}

// oneOf joins words as "a, b or c".
func oneOf(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// Table is a scheme's parameters.
type Table[O any] struct {
	// Scheme prefixes errors: "nats URL parameter ack_wait: …".
	Scheme string
	// Params are the parameters by name.
	Params map[string]Param[O]
}

// Read reads every parameter of q, in name order, into options; a
// repeated parameter's first value counts. An unknown parameter fails,
// named, with the nearest known name when one is close.
func (t Table[O]) Read(q url.Values) ([]O, error) {
	var opts []O
	for _, k := range slices.Sorted(maps.Keys(q)) {
		p, ok := t.Params[k]
		if !ok {
			return nil, t.unknown(k)
		}
		o, err := t.read(k, p, q.Get(k))
		if err != nil {
			return nil, err
		}
		opts = append(opts, o...)
	}
	return opts, nil
}

// Take reads the parameters t knows into options and removes them from q,
// leaving the others for the caller (a database driver's own parameters).
func (t Table[O]) Take(q url.Values) ([]O, error) {
	var opts []O
	for _, k := range slices.Sorted(maps.Keys(q)) {
		p, ok := t.Params[k]
		if !ok {
			continue
		}
		o, err := t.read(k, p, q.Get(k))
		if err != nil {
			return nil, err
		}
		opts = append(opts, o...)
		q.Del(k)
	}
	return opts, nil
}

// Split is Take for a URL whose other parameters all belong to a client
// library, named in pass (amqp091-go's heartbeat, a driver's sslmode): it
// leaves q holding only those. A parameter of t given more than once (only
// pass's may repeat), or one neither t nor pass names, fails, named.
func (t Table[O]) Split(q url.Values, pass ...string) ([]O, error) {
	if err := t.Once(q, pass...); err != nil {
		return nil, err
	}
	opts, err := t.Take(q)
	if err != nil {
		return nil, err
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if !slices.Contains(pass, k) {
			return nil, t.unknown(k, pass...)
		}
	}
	return opts, nil
}

// Once fails, named, on a parameter of q given more than once, but for
// those named in pass: for a scheme where a repeated value is a mistake
// rather than a list.
func (t Table[O]) Once(q url.Values, pass ...string) error {
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if n := len(q[k]); n != 1 && !slices.Contains(pass, k) {
			return fmt.Errorf("%s URL parameter %s: given %d times", t.Scheme, redact.Name(k), n)
		}
	}
	return nil
}

func (t Table[O]) read(name string, p Param[O], v string) ([]O, error) {
	o, err := p.Read(v)
	if err != nil {
		return nil, fmt.Errorf("%s URL parameter %s: %w", t.Scheme, name, err)
	}
	return o, nil
}

// Unknown is the error of a parameter that none of t's names, nor others
// the caller knows of, match: it names it, the nearest known name when one
// is close, and every known name.
func (t Table[O]) Unknown(name string, others ...string) error {
	return t.unknown(name, others...)
}

func (t Table[O]) unknown(name string, others ...string) error {
	known := append(slices.Collect(maps.Keys(t.Params)), others...)
	slices.Sort(known)
	hint := ""
	if near := Nearest(name, known); near != "" {
		hint = fmt.Sprintf(" (did you mean %s?)", near)
	}
	return fmt.Errorf("%s URL: unknown parameter %q%s; known: %s", t.Scheme, redact.Name(name), hint, strings.Join(known, ", "))
}

// OptionError is the error of an adapter's option given a value it
// refuses. It names the option as a program writes it ("WithAckWait"), so
// that an opener reading a URL can name the parameter the user wrote
// instead (Table.Explain).
type OptionError struct {
	// Pkg is the adapter's package, which starts the message: "nats".
	Pkg string
	// Option is the option's Go name: "WithAckWait".
	Option string
	// Err says what is wrong with the value.
	Err error
}

// Error returns "pkg: option Option: Err".
func (e *OptionError) Error() string { return e.Pkg + ": option " + e.Option + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *OptionError) Unwrap() error { return e.Err }

// Explain rewrites the error of a constructor opened by URL so that it
// names the URL parameter the user wrote instead of the Go option it
// stands for: an *OptionError of an option of t ("WithAckWait") becomes
// one about its parameter ("URL parameter ack_wait"), still wrapping err.
// Other errors come back as they are.
func (t Table[O]) Explain(err error) error {
	var oe *OptionError
	if !errors.As(err, &oe) {
		return err
	}
	name, ok := t.NameOf(oe.Option)
	if !ok {
		return err
	}
	return &explained{fmt.Sprintf("%s URL parameter %s: %v", t.Scheme, name, oe.Err), err}
}

// explained is an error retold in URL terms; it still wraps the original.
type explained struct {
	msg string
	err error
}

func (e *explained) Error() string { return e.msg }
func (e *explained) Unwrap() error { return e.err }

// Nearest returns the name in known nearest to name, when it is within
// two edits (or one, for names of up to four letters), or "".
func Nearest(name string, known []string) string {
	best, bestD := "", 3
	if len(name) <= 4 {
		bestD = 2
	}
	for _, k := range known {
		if d := distance(strings.ToLower(name), k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// NameOf returns the parameter that sets the Go option named option, for a
// constructor that words its errors in the URL's terms.
func (t Table[O]) NameOf(option string) (string, bool) {
	for name, p := range t.Params {
		if p.Option == option && option != "" {
			return name, true
		}
	}
	return "", false
}

// ParseURL parses rawURL as url.Parse does, with an error that quotes none
// of it (a URL may hold a password): it says what is wrong and how a
// password with special characters is written. An opener parses what it is
// given with it before reading parameters.
func ParseURL(rawURL string) (*url.URL, error) { return redact.ParseURL(rawURL) }

// ParseQuery parses a URL's raw query as url.ParseQuery does, with an error
// that quotes none of it.
func ParseQuery(rawQuery string) (url.Values, error) { return redact.ParseQuery(rawQuery) }

// Redact returns rawURL with its password and any secret-looking parameter
// (password, secret, token, key, sasl…) hidden, for logs and errors; a URL
// that does not parse loses more than its password, never less.
func Redact(rawURL string) string { return redact.URL(rawURL) }

// RedactError returns err's text with every secret of rawURL hidden, for
// a client library whose errors quote the URL it was given.
func RedactError(err error, rawURL string) string { return redact.Error(err, rawURL) }
