package postgres

import (
	"net/url"
	"testing"

	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/redact/redacttest"
	"github.com/idemq/idemq/internal/sqlident"
)

// FuzzParseURL: the postgres:// parser never panics, never quotes the
// password in an error, keeps the credentials for the driver intact, takes
// its own parameters (table, retention, migrate, …) out of the driver's
// URL, and never lets an invalid table name through.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"postgres://app:s3cret@db.example.com:5432/app?table=claims&retention=168h&migrate=false",
		"postgres://u:p%40ss@h/db?sslmode=verify-full&sslrootcert=/ca.pem&tls=true&ssl-ca=/ca.pem",
		"postgres://u:pw@h/db?table=x;DROP TABLE y&retention=soon", "postgres://u:pw@h/db?partitions=24h&isolation=serializable",
		"postgres://u:pw@h/db?migrate=maybe", "postgres://u:pw@h/db?a=1;b=2",
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

// parseAll is what core.OpenStore does with a postgres:// URL before it
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
