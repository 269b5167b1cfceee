// Package redact keeps the credentials of connection URLs and DSNs out of
// what people read. URL and Error hide them in text that must name a URL
// (a log line, a driver's error); ParseURL and ParseQuery parse and, when
// the input is malformed, say what is wrong without quoting any of it,
// because no rule can tell where the password of a malformed URL ends.
package redact

import (
	"errors"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Mask is what stands in for a hidden secret.
const Mask = "xxxxx"

// secretWords are the fragments that make a query parameter's name secret.
var secretWords = []string{"password", "passwd", "pwd", "secret", "token", "key", "credential", "sasl"}

// keptWhere are the endings of a parameter's name that make it name where
// a secret is kept, not hold it: secret_env names an environment
// variable, secret_file and key_file a path.
var keptWhere = []string{"_env", "_file"}

// SecretParam reports whether a query parameter of this name holds a
// secret whose value must not be shown: its name, unescaped and in any
// case, contains password, passwd, pwd, secret, token, key, credential or
// sasl, and does not end in _env or _file (those name the variable or the
// file that holds the secret, which are shown).
func SecretParam(name string) bool {
	if un, err := url.QueryUnescape(name); err == nil {
		name = un
	}
	name = strings.ToLower(name)
	for _, end := range keptWhere {
		if strings.HasSuffix(name, end) {
			return false
		}
	}
	for _, w := range secretWords {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// nestedUserinfo is the password of a "//user:pass@" anywhere in a string.
var nestedUserinfo = regexp.MustCompile(`//[^/?#:@]*:([^/?#@]+)@`)

// Name returns name for an error message when it is a plain name (letters,
// digits, '_', '-' and '.', at most 64 bytes), the way parameter names are
// written, and a description without it otherwise: a name with other bytes
// may be part of a password a typo moved into the query.
func Name(name string) string {
	if name == "" || len(name) > 64 || strings.Trim(name, plainBytes) != "" {
		return "(a name of " + strconv.Itoa(len(name)) + " bytes, not shown)"
	}
	return name
}

const plainBytes = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-."

// span is a byte range [from, to) of a URL that holds a secret.
type span struct{ from, to int }

// URL returns raw with its password and the values of its secret query
// parameters (SecretParam) replaced by Mask. For a URL that parses with a
// user name, the password is the one url.Parse finds. For one that does
// not parse, or whose password may have ended up in its path, query or
// fragment (a raw '/', '?' or '#' before the '@'), everything from the
// first ':' after the user name to the last '@' is hidden, or up to the
// end of the host when there is no '@': more than the password, never
// less. In a URL without "//" ("user:pass@tcp(host)/db", "postgres:u:p@h")
// all that stands between the scheme and the last '@' is hidden. A URL
// with a "//" authority that parses still parses after URL, and
// URL(URL(raw)) == URL(raw).
func URL(raw string) string {
	// Hiding one span can make another (a query value running into a
	// hidden password, say): hide until nothing changes.
	s := raw
	for range 8 {
		next := mask(s, secretSpans(s))
		if next == s {
			if keepsShape(raw, s) {
				return s
			}
			break
		}
		s = next
	}
	return nothingShown(raw)
}

// keepsShape reports whether redacted still parses if raw is a URL with a
// "//" authority that parses.
func keepsShape(raw, redacted string) bool {
	u, err := url.Parse(raw)
	if err != nil || !strings.HasPrefix(raw[schemeEnd(raw):], "//") {
		return true
	}
	_, err = url.Parse(redacted)
	return err == nil && u != nil
}

// nothingShown is what URL shows of raw when hiding its secrets one by one
// does not settle or would break its shape: the scheme, and masks for the
// rest (a user, a password and a host, so the result still parses and
// says that there were credentials).
func nothingShown(raw string) string {
	scheme := raw[:schemeEnd(raw)]
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return scheme + "//" + Mask + ":" + Mask + "@" + Mask
	}
	return scheme + "//" + Mask
}

func mask(raw string, spans []span) string {
	if len(spans) == 0 {
		return raw
	}
	var b strings.Builder
	last := 0
	for _, s := range spans {
		b.WriteString(raw[last:s.from])
		b.WriteString(Mask)
		last = s.to
	}
	b.WriteString(raw[last:])
	return b.String()
}

// Error returns err's text with every secret of raw (the spans URL hides,
// raw, unescaped and escaped again, since a driver may quote any of these
// forms) replaced by Mask. It is for errors of drivers that quote the URL
// they were given; a secret shorter than 3 bytes is left, as replacing it
// would garble the message without hiding anything worth hiding.
func Error(err error, raw string) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	for _, s := range Secrets(raw) {
		if len(s) >= 3 {
			msg = strings.ReplaceAll(msg, s, Mask)
		}
	}
	return msg
}

// Secrets returns the secrets of raw in every form an error may quote
// them (as written, unescaped, escaped again), longest first.
func Secrets(raw string) []string {
	var out []string
	add := func(s string) {
		if s != "" && s != Mask && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	// Each secret alone as well as the merged spans: a driver may quote a
	// nested URL's password without the parameter around it.
	for _, sp := range append(secretSpans(raw), foundSpans(raw)...) {
		s := raw[sp.from:sp.to]
		add(s)
		for _, un := range unescapings(s) {
			add(un)
			add(url.QueryEscape(un))
			add(url.PathEscape(un))
			if enc := url.UserPassword("u", un).String(); strings.HasPrefix(enc, "u:") {
				add(enc[2:])
			}
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

func unescapings(s string) []string {
	var out []string
	if un, err := url.PathUnescape(s); err == nil && un != s {
		out = append(out, un)
	}
	if un, err := url.QueryUnescape(s); err == nil && un != s {
		out = append(out, un)
	}
	return out
}

// foundSpans finds the password and the secret parameter values of raw by
// every rule, overlapping as they come.
func foundSpans(raw string) []span {
	// Split as url.Parse does: the fragment at the first '#', the scheme,
	// then the query at the first '?'.
	main := raw
	if i := strings.IndexByte(raw, '#'); i >= 0 {
		main = raw[:i]
	}
	start := schemeEnd(main)
	rest := main[start:]
	noQuery := rest
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		noQuery = rest[:i]
	}
	_, perr := url.Parse(raw)
	lastAt := strings.LastIndexByte(raw, '@')

	var pw []span
	end := start // where the part after the credentials starts
	// loose takes a span found without url.Parse's help, unless hiding it
	// would break a URL that parses: then the '@' is where url.Parse put
	// it, beyond the credentials.
	loose := func(s span, after int) {
		if perr == nil {
			if _, err := url.Parse(raw[:s.from] + Mask + raw[s.to:]); err != nil {
				return
			}
		}
		pw, end = append(pw, s), after
	}
	switch {
	case strings.HasPrefix(rest, "//"):
		start += 2
		authority := noQuery[2:]
		if i := strings.IndexByte(authority, '/'); i >= 0 {
			authority = authority[:i]
		}
		at := strings.LastIndexByte(authority, '@')
		switch {
		case perr == nil && at >= 0:
			// The password as url.Parse finds it.
			if c := strings.IndexByte(authority[:at], ':'); c >= 0 {
				pw = append(pw, span{start + c + 1, start + at})
			}
			end = start + at
		case lastAt >= start:
			// Malformed, or the '@' is beyond the host: from the first
			// ':' after the user name to the last '@'.
			if c := strings.IndexByte(raw[start:lastAt], ':'); c >= 0 {
				loose(span{start + c + 1, lastAt}, lastAt)
			}
		case perr != nil:
			// Malformed without an '@': from the first ':' to the end of
			// the host, where a password without its host would be.
			if c := strings.IndexByte(authority, ':'); c >= 0 {
				loose(span{start + c + 1, start + len(authority)}, start+len(authority))
			}
		}
	case lastAt >= start && (start > 0 || strings.IndexByte(raw[:lastAt], ':') >= 0):
		// No "//": a DSN ("user:pass@tcp(host)/db", which url.Parse reads
		// as scheme "user") or an opaque URL ("postgres:u:p@h").
		// These are DSNs before they are URLs: hidden even where that
		// leaves something url.Parse would not take.
		if start > 0 && lastAt > start {
			pw, end = append(pw, span{start, lastAt}), lastAt
		} else if c := strings.IndexByte(raw[:lastAt], ':'); c >= 0 && c+1 < lastAt {
			pw, end = append(pw, span{c + 1, lastAt}), lastAt
		}
	}
	// A password with '@' in it ends at its last '@' by the rules above;
	// a reader who takes the first '@' (the go-sql-driver DSN's last '@'
	// before a '/', say) sees a shorter one, which Error must hide too.
	for _, p := range pw {
		for i := p.from + 1; i < p.to; i++ {
			if raw[i] == '@' {
				pw = append(pw, span{p.from, i})
			}
		}
	}
	// The query as url.Parse finds it, the one after the '@' of a
	// malformed URL, and the passwords of URLs inside it (an endpoint=
	// parameter, say).
	spans := append(pw, append(querySpans(raw, start), querySpans(raw, end)...)...)
	for _, m := range nestedUserinfo.FindAllStringSubmatchIndex(raw, -1) {
		spans = append(spans, span{m[2], m[3]})
	}
	return spans
}

// secretSpans are the spans of foundSpans in order, those that overlap or
// touch hidden as one.
func secretSpans(raw string) []span {
	spans := foundSpans(raw)
	slices.SortFunc(spans, func(a, b span) int { return a.from - b.from })
	var merged []span
	for _, s := range spans {
		if n := len(merged); n > 0 && s.from <= merged[n-1].to {
			merged[n-1].to = max(merged[n-1].to, s.to)
			continue
		}
		merged = append(merged, s)
	}
	return merged
}

// schemeEnd returns the index just after "scheme:" in s, or 0 when s has
// no scheme, by url.Parse's rule.
func schemeEnd(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' || c == '+' || c == '-' || c == '.':
			if i == 0 {
				return 0
			}
		case c == ':':
			if i == 0 {
				return 0
			}
			return i + 1
		default:
			return 0
		}
	}
	return 0
}

// querySpans finds the values of secret parameters in what follows the
// first '?' at or after from: the query and the fragment.
func querySpans(raw string, from int) []span {
	q := strings.IndexByte(raw[from:], '?')
	if q < 0 {
		return nil
	}
	pos := from + q + 1
	query := raw[pos:]
	var spans []span
	// ';' separates too (url.ParseQuery refuses it, other parsers do not),
	// and so does '#': a fragment's pairs are hidden like the query's.
	for pair := range strings.FieldsFuncSeq(query, func(r rune) bool { return r == '&' || r == ';' || r == '#' }) {
		at := pos + strings.Index(raw[pos:], pair)
		if k, v, ok := strings.Cut(pair, "="); ok && v != "" && v != Mask && SecretParam(k) {
			spans = append(spans, span{at + len(k) + 1, at + len(pair)})
		}
		pos = at + len(pair)
	}
	return spans
}

// ParseURL parses raw like url.Parse. Its error quotes none of raw: it says
// what is wrong ("invalid port after host", "invalid %-escape") and how a
// password with special characters is written.
func ParseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		u, err = parseHostList(raw, err)
	}
	if err != nil {
		return nil, errors.New("invalid URL: " + reason(err) + "; percent-encode '@', ':', '/', '?', '#' and '%' in a user name or password")
	}
	return u, nil
}

// parseHostList parses a URL whose authority names several hosts
// (scheme://user@h1:5672,h2,[::1]:5673/…, the form of a cluster or a
// primary with standbys), which net/url refuses when a host other than the
// last has a port or is an IPv6 literal: the host list is set aside, the
// rest parsed, and the list kept as the URL's Host for the adapter to split.
// Any other URL gets perr back.
func parseHostList(raw string, perr error) (*url.URL, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, perr
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority := rest[:end]
	at := strings.LastIndex(authority, "@")
	hosts := authority[at+1:]
	if !strings.Contains(hosts, ",") {
		return nil, perr
	}
	u, err := url.Parse(scheme + "://" + authority[:at+1] + "hosts" + rest[end:])
	if err != nil {
		return nil, perr
	}
	u.Host = hosts
	return u, nil
}

// ParseQuery parses a raw query like url.ParseQuery, with an error that
// quotes none of it.
func ParseQuery(rawQuery string) (url.Values, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, errors.New("invalid query: " + reason(err))
	}
	return q, nil
}

// reason says what an error of net/url says, without the input it quotes.
func reason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var msg string
	var ee url.EscapeError
	var he url.InvalidHostError
	switch {
	case errors.As(err, &ee):
		msg = "invalid %-escape (a literal '%' is written %25)"
	case errors.As(err, &he):
		msg = "invalid character in the host"
	default:
		// net/url quotes what it rejects with strconv.Quote: keep its
		// words, drop the quotation.
		msg = err.Error()
		if i, j := strings.IndexByte(msg, '"'), strings.LastIndexByte(msg, '"'); i >= 0 && j > i {
			msg = strings.Join(strings.Fields(msg[:i]+msg[j+1:]), " ")
		} else if i >= 0 {
			msg = strings.TrimSpace(msg[:i])
		}
		msg = strings.TrimPrefix(msg, "net/url: ")
	}
	return msg
}
