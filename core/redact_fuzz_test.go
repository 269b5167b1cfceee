package core_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/redact/redacttest"
)

// FuzzRedact: Redact never panics, is idempotent, keeps none of the
// secrets redacttest finds (nor does RedactError of an error quoting the
// URL), and when a URL with a "//" authority parses with a password or a
// secret-looking query parameter, the redacted URL parses to the same
// shape with every one of them replaced by xxxxx.
func FuzzRedact(f *testing.F) {
	for _, s := range []string{
		"amqp://guest:guest@127.0.0.1:5672/?queue=q",
		"amqps://u:p%40ss@h/vh?cacertfile=/ca.pem&keyfile=/k.pem",
		"postgres://app:s3cret@db:5432/app?sslmode=verify-full&sslpassword=kp",
		"mysql://root:pw@tcp(127.0.0.1:3306)/test",
		"sqs://AKID:SECRET@orders?endpoint=http://127.0.0.1:9324&region=eu-west-1",
		"kafka://u:p@b1:9092,b2:9092/topic?sasl=scram-sha-512&sasl_password=x&token=y",
		"amqp://u:p@h:notaport/", "://", "a:b@c", "http://[::1", "x://u:p:q@h/?key=1&key=2#frag",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		r := core.Redact(raw)
		if rr := core.Redact(r); rr != r {
			t.Fatalf("not idempotent:\n%q\n%q", r, rr)
		}
		quoting := core.RedactError(errors.New("dial "+raw+": refused"), raw)
		for _, s := range redacttest.Secrets(raw) {
			if redacttest.Quotes(r, s) {
				t.Fatalf("Redact(%q) = %q keeps the secret %q", raw, r, s)
			}
			if redacttest.Quotes(quoting, s) {
				t.Fatalf("RedactError of an error quoting %q keeps the secret %q: %s", raw, s, quoting)
			}
		}
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		rest := raw
		if u.Scheme != "" {
			rest = raw[len(u.Scheme)+1:]
		}
		ru, err := url.Parse(r)
		if err != nil && strings.HasPrefix(rest, "//") {
			t.Fatalf("Redact(%q) = %q no longer parses: %v", raw, r, err)
		}
		if err != nil {
			return // a DSN without "//", hidden past what url.Parse takes
		}
		if _, has := u.User.Password(); has && u.Host != "" {
			if p, _ := ru.User.Password(); p != "xxxxx" {
				t.Fatalf("Redact(%q) = %q keeps password %q", raw, r, p)
			}
		}
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			return
		}
		rq, _ := url.ParseQuery(ru.RawQuery)
		for k, vs := range q {
			if !redact.SecretParam(k) {
				continue
			}
			for i, v := range vs {
				if v != "" && i < len(rq[k]) && rq[k][i] != "xxxxx" {
					t.Fatalf("Redact(%q) = %q keeps %s=%q", raw, r, k, rq[k][i])
				}
			}
		}
	})
}

// FuzzRedactError: an error that quotes a URL's password, raw or escaped,
// loses it in RedactError whenever the password is 3 bytes or more.
func FuzzRedactError(f *testing.F) {
	for _, s := range []string{"guest", "p@ss:w/rd", "s3cr3t%", "ünï", "abc"} {
		f.Add(s, "db.example.com")
	}
	f.Fuzz(func(t *testing.T, pass, host string) {
		if len(pass) < 3 || pass == "xxxxx" || strings.ContainsAny(host, "/@?#:%") || host == "" {
			return // a password that is the mask itself cannot be told from it
		}
		raw := "postgres://app:" + url.PathEscape(pass) + "@" + host + "/db"
		if u, err := url.Parse(raw); err != nil {
			return
		} else if p, _ := u.User.Password(); p != pass {
			return // PathEscape leaves ':' and '@'-free forms alone; not this test's subject
		}
		err := errors.New("cannot connect to " + raw + " with password " + pass + " (escaped " + url.PathEscape(pass) + ")")
		msg := core.RedactError(err, raw)
		// Where the error quoted it, in each form; the same letters
		// elsewhere (the host, or "xxx" inside a mask) are no leak.
		for _, quoted := range []string{"app:" + url.PathEscape(pass) + "@", "password " + pass + " ", "(escaped " + url.PathEscape(pass) + ")"} {
			if strings.Contains(msg, quoted) {
				t.Fatalf("password %q survives in %q", pass, msg)
			}
		}
	})
}

// FuzzOpen: OpenSource, OpenPublisher and OpenStore quote no secret of the
// URL they are given: not when it does not parse, has no scheme or one
// nobody registered, and not when the driver's own error quotes the URL
// in the forms drivers use (as given, re-encoded by url.URL.String, the
// password unescaped).
func FuzzOpen(f *testing.F) {
	registerQuotingDriver()
	for _, s := range []string{
		"fuzzq://app:s3cretpw@h:5672/vh?queue=q&token=t0ken",
		"fuzzq://app:p%C3%BCss1@h/?sasl_password=s%2Fcret",
		"fuzzq://app:s3cr/etpw@h/", "fuzzq://app:s3cretpw@h:bad/", "nope://app:s3cretpw@h/", "app:s3cretpw@h/db",
	} {
		f.Add(s)
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, raw string) {
		redacttest.NoSecret(t, raw, func(raw string) error { _, err := core.OpenSource(ctx, raw); return err })
		redacttest.NoSecret(t, raw, func(raw string) error { _, err := core.OpenPublisher(ctx, raw); return err })
		redacttest.NoSecret(t, raw, func(raw string) error { _, err := core.OpenStore[*sql.Tx](ctx, raw); return err })
	})
}

var registerOnce sync.Once

// registerQuotingDriver registers fuzzq://, a broker and store whose
// openers fail quoting everything they were given, as careless drivers do.
func registerQuotingDriver() {
	registerOnce.Do(func() {
		quote := func(u *url.URL) error {
			pw, _ := u.User.Password()
			return fmt.Errorf("dial %s: refused (user %s, password %s, query %s)", u, u.User.Username(), pw, u.Query())
		}
		driver.RegisterSource("fuzzq", func(_ context.Context, u *url.URL, _ driver.OpenConfig) (driver.Source, error) { return nil, quote(u) })
		driver.RegisterPublisher("fuzzq", func(_ context.Context, u *url.URL, _ driver.OpenConfig) (driver.Publisher, error) {
			return nil, quote(u)
		})
		driver.RegisterStore("fuzzq", func(_ context.Context, u *url.URL) (any, error) { return nil, quote(u) })
	})
}
