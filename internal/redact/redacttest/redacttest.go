// Package redacttest checks, for tests and fuzz targets, that an error
// about a URL or DSN quotes none of its secrets. It finds the secrets by
// every reading a person may have meant (url.Parse's, the "//user:pass@"
// of a URL that does not parse, the go-sql-driver DSN's, secret query
// parameters), independently of package redact's own rules, so that a
// mistake in those rules shows up here.
package redacttest

import (
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/redact"
)

// MinLen is the shortest secret the check looks for: shorter strings turn
// up in error messages by chance.
const MinLen = 4

var (
	// userinfoRE is the password of "//user:pass@" whether or not the URL
	// parses; looseRE the same up to the last '@', for a URL that does not
	// parse because its password holds a raw '/', '?' or '#'.
	userinfoRE = regexp.MustCompile(`//[^/?#:@]*:([^/?#@]+)@`)
	looseRE    = regexp.MustCompile(`//[^/?#:@]*:(.+)@`)
	// paramRE is one parameter of a query (what follows the first '?'),
	// whether or not the query parses.
	paramRE = regexp.MustCompile(`[?&;]([^=&#;]*)=([^&#;]*)`)
)

// Secrets returns the secrets of raw worth looking for in an error, each
// as written and unescaped: long enough (MinLen), and written only once
// (ignoring case), since a secret that is also the host or a parameter's
// name may rightly be named as that.
func Secrets(raw string) []string {
	var out []string
	for _, c := range candidates(raw) {
		out = append(out, c.form)
	}
	return out
}

// candidate is a secret in one form and the text of raw it comes from.
type candidate struct{ form, written string }

func candidates(raw string) []candidate {
	var found []string
	u, perr := url.Parse(raw)
	if perr != nil {
		if m := looseRE.FindStringSubmatch(raw); m != nil {
			found = append(found, m[1])
		}
	}
	if perr == nil && u.User != nil {
		// The password as url.Parse reads it, as written: in the
		// authority after "//", up to its last '@'.
		if _, ok := u.User.Password(); ok {
			if i := strings.Index(raw, "//"); i >= 0 {
				auth := raw[i+2:]
				if j := strings.IndexAny(auth, "/?#"); j >= 0 {
					auth = auth[:j]
				}
				if at := strings.LastIndexByte(auth, '@'); at >= 0 {
					if c := strings.IndexByte(auth[:at], ':'); c >= 0 {
						found = append(found, auth[c+1:at])
					}
				}
			}
		}
	}
	for _, m := range userinfoRE.FindAllStringSubmatch(raw, -1) {
		found = append(found, m[1])
	}
	if q := strings.IndexByte(raw, '?'); q >= 0 {
		for _, m := range paramRE.FindAllStringSubmatch(raw[q:], -1) {
			if redact.SecretParam(m[1]) {
				found = append(found, m[2])
			}
		}
	}
	if p, ok := dsnPassword(raw); ok && !strings.Contains(raw, "//") {
		found = append(found, p)
	}

	lower := asciiLower(raw)
	var out []candidate
	seen := map[string]bool{}
	keep := func(form, written string, times int) {
		if len(form) >= MinLen && !seen[form] && strings.Count(lower, asciiLower(form)) <= times {
			seen[form] = true
			out = append(out, candidate{form, written})
		}
	}
	for _, s := range found {
		if !strings.Contains(raw, s) {
			continue
		}
		keep(s, s, 1)
		// An unescaped form counts only if it is nowhere in raw as written.
		if un, err := url.PathUnescape(s); err == nil && un != s {
			keep(un, s, 0)
		}
		if un, err := url.QueryUnescape(s); err == nil && un != s {
			keep(un, s, 0)
		}
	}
	return out
}

// dsnPassword is the password of a go-sql-driver DSN,
// [user[:password]@][net[(addr)]]/dbname[?params], found as that driver
// finds it: the last '/', the last '@' before it, the first ':' before that.
func dsnPassword(dsn string) (string, bool) {
	slash := strings.LastIndexByte(dsn, '/')
	if slash <= 0 {
		return "", false
	}
	at := strings.LastIndexByte(dsn[:slash], '@')
	if at < 0 {
		return "", false
	}
	colon := strings.IndexByte(dsn[:at], ':')
	if colon < 0 {
		return "", false
	}
	return dsn[colon+1 : at], true
}

// NoSecret fails t when parse(raw) returns an error that quotes a secret
// of raw. A secret found in the error counts as quoted only when the
// input put it there: parse is run again on raw with that secret's
// letters and digits shifted, and if the new error still holds the
// secret, the words came from the message itself (a password "name" in
// "user name"), not from the input.
func NoSecret(t testing.TB, raw string, parse func(string) error) {
	t.Helper()
	err := parse(raw)
	if err == nil {
		return
	}
	msg := err.Error()
	for _, c := range candidates(raw) {
		if !Quotes(msg, c.form) {
			continue
		}
		i := strings.Index(raw, c.written)
		other := raw[:i] + shift(c.written) + raw[i+len(c.written):]
		if err2 := parse(other); err2 != nil && Quotes(err2.Error(), c.form) {
			continue // the message's own words
		}
		t.Fatalf("error quotes the secret %q of %q: %v", c.form, raw, err)
	}
}

// shift replaces each letter and digit of s by the next one of its kind,
// keeping hex digits hex (so a %-escape stays valid or invalid) and
// everything else as it is.
func shift(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'f':
			b[i] = 'a' + (c-'a'+1)%6
		case c >= 'A' && c <= 'F':
			b[i] = 'A' + (c-'A'+1)%6
		case c >= 'g' && c <= 'z':
			b[i] = 'g' + (c-'g'+1)%20
		case c >= 'G' && c <= 'Z':
			b[i] = 'G' + (c-'G'+1)%20
		case c >= '0' && c <= '9':
			b[i] = '0' + (c-'0'+1)%10
		}
	}
	return string(b)
}

// asciiLower lowers ASCII letters only: strings.ToLower would turn invalid
// UTF-8 into U+FFFD and miscount.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// Quotes reports whether text holds secret outside the masks that hide
// secrets: a mask is no leak of a secret made of x's ("xxxx").
func Quotes(text, secret string) bool {
	for _, part := range strings.Split(text, redact.Mask) {
		if strings.Contains(part, secret) {
			return true
		}
	}
	return false
}
