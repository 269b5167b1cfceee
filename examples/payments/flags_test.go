package main

import (
	"errors"
	"flag"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
)

func TestParseFlags(t *testing.T) {
	ok := []string{"--broker", "amqp://guest:guest@h/?queue=q", "--store", "sqlite://x.db"}
	s, err := parseFlags(ok, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.consumer != "payments" || s.batch != 1 || s.concurrency != 1 {
		t.Errorf("defaults: %+v", s)
	}
	if _, err := parseFlags([]string{"--help"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v, want flag.ErrHelp", err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--store", "sqlite://x.db"}, "--broker"},
		{[]string{"--broker", "mem://q"}, "--store"},
		{append(ok, "--batch", "0"), "--batch"},
		{append(ok, "--concurrency", "0"), "--concurrency"},
		{append(ok, "--duplicates", "1.5"), "--duplicates"},
		{append(ok, "--tables", "x; DROP"), "--tables"},
		{append(ok, "--log-level", "loud"), "--log-level"},
		{append(ok, "extra"), "unexpected argument"},
		{[]string{"--broker", "mem://q", "--store", "oracle://db"}, "--store"},
		{append(ok, "--lease", "5s"), "--provider"},
		{append(ok, "--provider", "ftp://pay"), "--provider"},
		{append(ok, "--provider", "http://pay", "--lease", "1ms"), "--lease"},
		{append(ok, "--provider", "http://pay", "--window", "0"), "--window"},
	} {
		if _, err := parseFlags(c.args, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseFlags(%q): %v, want an error naming %s", c.args, err, c.want)
		}
	}
	if s, err := parseFlags(append(ok, "--provider", "http://127.0.0.1:8080/v1", "--lease", "2s"), io.Discard); err != nil || s.lease != 2*time.Second || s.window != 500 {
		t.Errorf("the leased mode's flags: %+v, %v", s, err)
	}
	// --publish needs no store.
	if _, err := parseFlags([]string{"--broker", "mem://q", "--publish", "10"}, io.Discard); err != nil {
		t.Errorf("--publish without --store: %v", err)
	}
}

// TestTraffic: the same seed gives the same messages; the duplicates are
// exact repeats (same id, same body) and come to about the asked fraction.
func TestTraffic(t *testing.T) {
	a, ua := traffic(7, 5000, 0.2, 50)
	b, ub := traffic(7, 5000, 0.2, 50)
	if len(a) != 5000 || len(ua) != len(ub) {
		t.Fatalf("%d sends, %d and %d unique", len(a), len(ua), len(ub))
	}
	byID := map[string]sent{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("send %d differs between runs with the same seed: %+v, %+v", i, a[i], b[i])
		}
		if prev, seen := byID[a[i].id]; seen && prev != a[i] {
			t.Fatalf("id %s repeated with a different payment", a[i].id)
		}
		byID[a[i].id] = a[i]
	}
	if len(byID) != len(ua) {
		t.Errorf("%d distinct ids, %d unique payments", len(byID), len(ua))
	}
	if d := 5000 - len(ua); d < 850 || d > 1150 {
		t.Errorf("%d duplicates of 5000, want about 1000", d)
	}
	if _, uc := traffic(8, 5000, 0.2, 50); uc[0] == ua[0] {
		t.Errorf("another seed gave the same first payment")
	}
}

func TestDecode(t *testing.T) {
	p, err := decode([]byte(`{"account": "acc-17", "amount_cents": 1250}`))
	if err != nil || p.Account != "acc-17" || p.AmountCents != 1250 {
		t.Fatalf("decode: %+v, %v", p, err)
	}
	for _, body := range []string{`not json`, `{"amount_cents": 5}`, `{"account": "a"}`, `{"account": "a", "amount_cents": "x"}`} {
		if _, err := decode([]byte(body)); !core.IsPermanent(err) {
			t.Errorf("decode(%s): %v, want a permanent error (dead letter)", body, err)
		}
	}
}

// TestFailuresExitOneWithoutSecrets runs the built service against
// services that are not there: it exits 1 and its output never shows the
// passwords of its URLs.
func TestFailuresExitOneWithoutSecrets(t *testing.T) {
	bin := serviceBinary(t)
	const secret = "Sup3rS3cretPW"
	db := "sqlite://" + filepath.Join(t.TempDir(), "x.db")
	for _, args := range [][]string{
		{"--broker", "amqp://app:" + secret + "@127.0.0.1:1/?queue=q", "--store", "postgres://app:" + secret + "@127.0.0.1:1/db"},
		{"--broker", "amqp://app:" + secret + "@127.0.0.1:1/?queue=q", "--store", db},
		{"--broker", "amqp://app:" + secret + "@127.0.0.1:1/?queue=q", "--publish", "10"},
		{"--broker", "nats://app:" + secret + "@127.0.0.1:1/q", "--store", db},
		{"--broker", "redis://app:" + secret + "@127.0.0.1:1/q?group=payments", "--store", db},
		{"--broker", "redis://app:" + secret + "@127.0.0.1:1/q?group=payments", "--publish", "10"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("payments %q: %v, want exit code 1\n%s", args, err, out)
		}
		if strings.Contains(string(out), secret) {
			t.Errorf("payments %q shows the password:\n%s", args, out)
		}
		if !strings.Contains(string(out), "xxxxx") {
			t.Errorf("payments %q: the output names no (redacted) URL:\n%s", args, out)
		}
	}
}

// The leased mode refuses to start without a key secret, naming the
// variable: a key derived from no secret could be guessed.
func TestLeasedModeNeedsKeySecret(t *testing.T) {
	db := "sqlite://" + filepath.Join(t.TempDir(), "x.db")
	cmd := exec.Command(serviceBinary(t), "--broker", "mem://q", "--store", db, "--provider", "http://127.0.0.1:1")
	cmd.Env = append(cmd.Environ(), keySecretEnv+"=short")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), keySecretEnv) {
		t.Errorf("%v, want exit code 1 naming %s:\n%s", err, keySecretEnv, out)
	}
}
