package sqlite

import (
	"net/url"
	"testing"

	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/redact/redacttest"
)

// FuzzParseURL: the sqlite:// parser never panics, quotes no secret in an
// error, gives a path whenever it accepts, and every option it returns is valid or reports its own error
// (table names are SQL identifiers, never spliced unchecked).
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"sqlite://app.db", "sqlite:///var/lib/app.db?table=claims&retention=168h&busy_timeout=5s",
		"sqlite://app.db?table=x;DROP TABLE y", "sqlite:app.db", "sqlite://?table=t", "sqlite://a.db?retention=-1h&bogus=1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		redacttest.NoSecret(t, raw, func(raw string) error {
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
		})
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		path, opts, err := parseURL(u)
		if err != nil {
			return
		}
		if path == "" {
			t.Fatalf("accepted %q without a path", raw)
		}
		if cfg, err := buildConfig(opts); err == nil {
			if ValidateIdentifier(cfg.Table) != nil {
				t.Fatalf("table %q accepted", cfg.Table)
			}
		}
	})
}
