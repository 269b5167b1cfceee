package redacttest

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// recorder is a testing.TB that remembers whether the check failed.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

func TestSecretsReadings(t *testing.T) {
	for raw, want := range map[string]string{
		"amqp://u:s3cret@h/":                "s3cret",
		"amqp://u:p@ssw0rd@h/":              "p@ssw0rd",
		"amqp://u:se/cret@h/":               "se/cret",
		"//:000%@":                          "000%",
		"root:pa55word@tcp(h)/db":           "pa55word",
		"kafka://h/t?sasl_password=hunter2": "hunter2",
		"x://h/?a=1;token=abcd":             "abcd",
		"amqp://u:p%40ssw@h/":               "p@ssw",
	} {
		if got := Secrets(raw); !slices.Contains(got, want) {
			t.Errorf("Secrets(%q) = %q, want %q among them", raw, got, want)
		}
	}
	for _, raw := range []string{"amqp://guest:guest@h/", "amqp://u:abc@h/", "kafka://h:9092/t?group=secret"} {
		if got := Secrets(raw); len(got) != 0 {
			t.Errorf("Secrets(%q) = %q, want none (repeated, short, not secret)", raw, got)
		}
	}
}

func TestNoSecretCatchesALeak(t *testing.T) {
	leaky := func(raw string) error {
		_, err := url.Parse(raw)
		return err // *url.Error quotes the whole URL
	}
	r := &recorder{TB: t}
	NoSecret(r, "amqp://u:s3cretpw@h:bad/", leaky)
	if r.failed == "" {
		t.Fatal("a parser quoting the password passed the check")
	}
}

func TestNoSecretIgnoresTheMessagesOwnWords(t *testing.T) {
	// The password "name" is in the message whatever the input holds.
	fixed := func(raw string) error { return errors.New("no user name in the URL") }
	r := &recorder{TB: t}
	NoSecret(r, "amqp://u:name@h/", fixed)
	if r.failed != "" {
		t.Fatalf("flagged the message's own words: %s", r.failed)
	}
	quiet := func(raw string) error {
		if strings.Contains(raw, "bad") {
			return errors.New("bad port")
		}
		return nil
	}
	NoSecret(r, "amqp://u:s3cretpw@h:bad/", quiet)
	if r.failed != "" {
		t.Fatalf("flagged an error without the secret: %s", r.failed)
	}
}
