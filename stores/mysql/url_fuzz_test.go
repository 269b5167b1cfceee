package mysql

import (
	"net/url"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/redact/redacttest"
	"github.com/idemq/idemq/internal/sqlident"
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
		redacttest.NoSecret(t, raw, parseAll)
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		conn, opts, err := parseURL(u)
		if err != nil {
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
		if cfg, err := buildConfig(opts); err == nil && sqlident.Check(cfg.Table) != nil {
			t.Fatalf("table %q accepted", cfg.Table)
		}
	})
}

// parseAll is what core.OpenStore does with a mysql:// URL before it
// connects: parse it, split the store's options off, build the config.
func parseAll(raw string) error {
	u, err := redact.ParseURL(raw)
	if err != nil {
		return err
	}
	_, opts, err := parseURL(u)
	if err != nil {
		return err
	}
	_, err = buildConfig(opts)
	return err
}

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
		"//:000%@", "Mysql://u:000%@h/db", "root:s3cret@tcp(h)/db?parseTime=s3cretx",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		redacttest.NoSecret(t, dsn, func(s string) error { _, err := ParseDSN(s); return err })
		c, err := ParseDSN(dsn)
		if err != nil {
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
