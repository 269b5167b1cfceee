package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
)

// The quickstart is the project's main job: it must stay correct under its
// own fault injection, at both batch sizes.
func TestQuickstartKeepsEveryInvariant(t *testing.T) {
	out := runOK(t, "-n", "1500", "-batch", "1,50", "-crashes", "0.01", "-lose-acks", "0.02", "-visibility", "300ms", "-progress=false")
	for _, row := range []string{"ids applied twice", "wrong balances", "lost messages", "msgs/s"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("table lacks %q:\n%s", row, out.String())
		}
	}
}

// With -outbox the payments are produced through the SQLite outbox, and a
// relay whose confirms get lost publishes copies: the consumer still
// applies each payment once.
func TestQuickstartThroughTheOutbox(t *testing.T) {
	out := runOK(t, "-n", "1500", "-batch", "20", "-outbox", "-lose-confirms", "0.3", "-visibility", "300ms", "-progress=false")
	row := func(label string) []int {
		m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(label) + `((?:\s+\d+)+)\s*$`).FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("table lacks %q:\n%s", label, out.String())
		}
		var ns []int
		for _, f := range strings.Fields(m[1]) {
			n, _ := strconv.Atoi(f)
			ns = append(ns, n)
		}
		return ns
	}
	written, relayed, lost, published := row("outbox rows written"), row("relayed (confirmed, marked sent)"), row("relay publishes, confirm lost"), row("published (with duplicates)")
	for i := range written {
		if written[i] != 1500 || relayed[i] != 1500 {
			t.Errorf("run %d: %d outbox rows written, %d relayed; want 1500 each", i, written[i], relayed[i])
		}
		// Each lost confirm sent its batch again: copies the consumer saw.
		if lost[i] == 0 || published[i] <= 1500 {
			t.Errorf("run %d: %d lost confirms and %d published: the relay's copies never reached the broker", i, lost[i], published[i])
		}
	}
}

// runOK runs the quickstart with args and fails the test unless every
// invariant held; it returns the output.
func runOK(t *testing.T, args ...string) *bytes.Buffer {
	t.Helper()
	s, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	ok, err := run(context.Background(), s, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || !strings.Contains(out.String(), "OK: every account balance equals the expected one") {
		t.Fatalf("quickstart %v failed:\n%s", args, out.String())
	}
	return &out
}

func TestQuickstartFlags(t *testing.T) {
	var help bytes.Buffer
	if _, err := parseFlags([]string{"--help"}, &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "-batch") {
		t.Errorf("--help: %v\n%s", err, help.String())
	}
	for _, bad := range [][]string{{"-batch", "0"}, {"-duplicates", "1.5"}, {"-lose-confirms", "-0.1"}, {"-n", "0"}, {"extra"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("flags %v accepted", bad)
		}
	}
}

// serviceURL returns the URL in env (or def) or skips the test naming the
// variable, unless IDEMQ_REQUIRE_SERVICES=1 makes that a failure.
func serviceURL(t *testing.T, env, def string, ping func(string) error) string {
	t.Helper()
	return servicetest.URL(t, env, def, func(_ context.Context, u string) error { return ping(u) })
}

// The quickstart pointed at the real Postgres and MariaDB with --store.
func TestQuickstartOnServerStores(t *testing.T) {
	ping := func(u string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if strings.HasPrefix(u, "postgres") {
			s, err := core.OpenStore[pgx.Tx](ctx, u)
			if err == nil {
				s.(interface{ Close() error }).Close()
			}
			return err
		}
		s, err := core.OpenStore[*sql.Tx](ctx, u)
		if err == nil {
			s.(interface{ Close() error }).Close()
		}
		return err
	}
	for _, tc := range []struct{ env, def string }{
		{"IDEMQ_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test"},
		{"IDEMQ_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			u := serviceURL(t, tc.env, tc.def, ping)
			if !strings.Contains(u, "://") { // a go-sql-driver DSN
				u = "mysql://" + strings.Replace(strings.Replace(u, "tcp(", "", 1), ")", "", 1)
			}
			s, err := parseFlags([]string{"-n", "800", "-batch", "1,40", "-store", u, "-visibility", "300ms", "-progress=false"}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			ok, err := run(context.Background(), s, &out)
			if err != nil {
				t.Fatal(err)
			}
			if !ok || !strings.Contains(out.String(), "OK: every account balance equals the expected one") {
				t.Fatalf("quickstart on %s failed:\n%s", core.Redact(u), out.String())
			}
		})
	}
}
