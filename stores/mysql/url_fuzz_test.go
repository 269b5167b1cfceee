package mysql

import (
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// FuzzParseURL: the mysql:// parser never panics, never quotes the
// password in an error, keeps the credentials for the driver intact, takes
// its own parameters (table, retention, migrate, …) out of the driver's
// URL, and never lets an invalid table name through.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"mysql://app:s3cret@db.example.com:5432/app?table=claims&retention=168h&migrate=false",
		"mysql://u:p%40ss@h/db?sslmode=verify-full&sslrootcert=/ca.pem&tls=true&ssl-ca=/ca.pem",
		"mysql://u:pw@h/db?table=x;DROP TABLE y&retention=soon", "mysql://u:pw@h/db?partitions=24h&isolation=serializable",
		"mysql://u:pw@h/db?migrate=maybe", "mysql://u:pw@h/db?a=1;b=2",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		pass, _ := u.User.Password()
		if strings.Count(strings.ToLower(raw), strings.ToLower(pass)) > 1 {
			pass = "" // also elsewhere in the URL, where an error may name it
		}
		conn, opts, err := parseURL(u)
		if err != nil {
			if len(pass) >= 4 && strings.Contains(err.Error(), pass) {
				t.Fatalf("error quotes the password %q: %v", pass, err)
			}
			return
		}
		cu, err := url.Parse(conn)
		if err != nil {
			t.Fatalf("driver URL %q of %q does not parse: %v", conn, raw, err)
		}
		if cu.User.String() != u.User.String() {
			t.Fatalf("credentials changed: %q → %q", u.User, cu.User)
		}
		for _, k := range []string{"table", "retention", "migrate"} {
			if cu.Query().Has(k) {
				t.Fatalf("store parameter %s passed on to the driver: %q", k, conn)
			}
		}
		if cfg, err := buildConfig(opts); err == nil && validateIdentifier(cfg.table) != nil {
			t.Fatalf("table %q accepted", cfg.table)
		} else if err != nil && len(pass) >= 4 && strings.Contains(err.Error(), pass) {
			t.Fatalf("option error quotes the password: %v", err)
		}
	})
}

// passwordRE finds the password of a URL whether or not it parses.
var passwordRE = regexp.MustCompile(`//[^/?#:@]*:([^/?#@]+)@`)

// FuzzParseDSN: ParseDSN (both DSN forms, and the ssl-* TLS parameters)
// never panics, never quotes the password in an error, and with TLS on
// and verification on, verifies the URL's host (or ssl-server-name), never
// the placeholder address of the driver's parameter parsing.
func FuzzParseDSN(f *testing.F) {
	for _, s := range []string{
		"root:pw@tcp(127.0.0.1:3306)/test?timeout=2s",
		"mysql://u:s3cret@db.example.com:3306/app?tls=true",
		"mysql://u:s3cret@db.example.com/app?tls=skip-verify",
		"mysql://u:s3cret@db.example.com/app?ssl-ca=/nonexistent.pem&ssl-server-name=x",
		"mysql://u:s3cret@db.example.com/app?ssl-cert=/c.pem", "mysql://u:s3cret@h:bad/app", "u:p@/db?tls=preferred",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		c, err := ParseDSN(dsn)
		pass := ""
		if m := passwordRE.FindStringSubmatch(dsn); m != nil && strings.Count(strings.ToLower(dsn), strings.ToLower(m[1])) == 1 {
			pass = m[1] // found whether or not the URL parses
		}
		if err != nil {
			if len(pass) >= 4 && strings.Contains(err.Error(), pass) {
				t.Fatalf("error quotes the password %q: %v", pass, err)
			}
			return
		}
		if !strings.HasPrefix(dsn, "mysql://") || c.TLS == nil || c.TLS.InsecureSkipVerify {
			return
		}
		u, _ := url.Parse(dsn)
		if want := u.Query().Get("ssl-server-name"); want != "" {
			if c.TLS.ServerName != want {
				t.Fatalf("server name %q; ssl-server-name is %q", c.TLS.ServerName, want)
			}
		} else if c.TLS.ServerName != u.Hostname() {
			t.Fatalf("server name %q; the URL's host is %q", c.TLS.ServerName, u.Hostname())
		}
	})
}
