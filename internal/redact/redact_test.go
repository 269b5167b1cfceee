package redact

import (
	"errors"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	cases := map[string]string{
		"amqp://guest:s3cret@host:5672/vh":               "amqp://guest:xxxxx@host:5672/vh",
		"kafka://b:9092/t?sasl_password=hunter2&group=g": "kafka://b:9092/t?sasl_password=xxxxx&group=g",
		"amqp://host:5672/":                              "amqp://host:5672/",
		// A raw '/', '?' or '#' in the password moves it out of the host.
		"mysql://u:12/cd@h/db":     "mysql://u:xxxxx@h/db",
		"mysql://u:12?cd@h/db":     "mysql://u:xxxxx@h/db",
		"kafka://#u:pw@h":          "kafka://#u:xxxxx@h",
		"amqp://u:p%zz@h/?queue=q": "amqp://u:xxxxx@h/?queue=q",
		// Malformed without an '@': the password may be where the port is.
		"mysql://user:secret":    "mysql://user:xxxxx",
		"mysql://user:secret/db": "mysql://user:xxxxx/db",
		// No "//": a DSN, an opaque URL.
		"root:pw@tcp(127.0.0.1:3306)/test": "root:xxxxx@tcp(127.0.0.1:3306)/test",
		"root:p/w@tcp(h)/db?x=1":           "root:xxxxx@tcp(h)/db?x=1",
		"postgres:u:pw@h/db":               "postgres:xxxxx@h/db",
		"tcp(h:3306)/db":                   "tcp(h:3306)/db",
		// Query separators and escaped names.
		"x://h/?a=1;token=abc":      "x://h/?a=1;token=xxxxx",
		"x://h/?pass%77ord=abc&b=2": "x://h/?pass%77ord=xxxxx&b=2",
		"x://h/?token=abc#frag":     "x://h/?token=xxxxx#frag",
		"x://h/?token=&b=2":         "x://h/?token=&b=2",
		"sqlite:///var/lib/app.db":  "sqlite:///var/lib/app.db",
		"mem://payments":            "mem://payments",
		"":                          "",
	}
	for in, want := range cases {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
		if got := URL(URL(in)); got != URL(in) {
			t.Errorf("URL(URL(%q)) = %q, not idempotent", in, got)
		}
	}
}

func TestError(t *testing.T) {
	raw := "postgres://app:p%C3%BCss@db/x?sslpassword=k%2Fey1"
	err := errors.New("connect postgres://app:p%C3%BCss@db/x as app/püss (sslpassword k/ey1, k%2Fey1)")
	got := Error(err, raw)
	for _, s := range []string{"p%C3%BCss", "püss", "k/ey1", "k%2Fey1"} {
		if strings.Contains(got, s) {
			t.Errorf("Error keeps %q: %s", s, got)
		}
	}
	if !strings.Contains(got, "connect postgres://app:xxxxx@db/x") {
		t.Errorf("Error lost the message around the secrets: %s", got)
	}
}

func TestParseErrorsQuoteNothing(t *testing.T) {
	for raw, want := range map[string]string{
		"amqp://u:pa/ss@h:5672/":        "invalid port after host",
		"postgres://u:se%zzcret@h/db":   "invalid %-escape",
		"post gres://u:topsecret@h":     "first path segment in URL cannot contain colon",
		"postgres://u:topsecret@h/\x7f": "invalid control character in URL",
		"mysql://u:topsecret@bad host/": "invalid character in the host",
	} {
		_, err := ParseURL(raw)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) = %v, want an error saying %q", raw, err, want)
			continue
		}
		for _, s := range []string{"pa/ss", "se%zz", "topsecret", "bad host"} {
			if strings.Contains(err.Error(), s) {
				t.Errorf("ParseURL(%q) error quotes %q: %v", raw, s, err)
			}
		}
	}
	if _, err := ParseQuery("a=1&token=%zzsecret"); err == nil || strings.Contains(err.Error(), "%zz") {
		t.Errorf("ParseQuery error %v", err)
	}
}

// A host list (a cluster's nodes, a primary and its standbys) parses with
// the whole list as Host, in the forms net/url alone refuses (each host is
// the adapter's to check); a URL bad elsewhere still fails.
func TestParseURLHostList(t *testing.T) {
	for raw, host := range map[string]string{
		"amqp://u:p%40ss@h1:5672,h2,[::1]:5673/vh?queue=q":    "h1:5672,h2,[::1]:5673",
		"postgres://app@[::1]:5432,[::1]:5433/db?x=1":         "[::1]:5432,[::1]:5433",
		"postgres://db1:5432,db2/db":                          "db1:5432,db2",
		"amqp://guest:guest@127.0.0.1:5672,127.0.0.1:5673/vh": "127.0.0.1:5672,127.0.0.1:5673",
	} {
		u, err := ParseURL(raw)
		if err != nil {
			t.Errorf("ParseURL(%q): %v", raw, err)
			continue
		}
		if u.Host != host {
			t.Errorf("ParseURL(%q).Host = %q, want %q", raw, u.Host, host)
		}
		if u.String() != raw {
			t.Errorf("ParseURL(%q).String() = %q", raw, u.String())
		}
	}
	for _, raw := range []string{"amqp://h1:5672,h2/%zz", "amqp://u:p@h1:5672,h2/?q=%zz#%zz"} {
		if _, err := ParseURL(raw); err == nil {
			t.Errorf("ParseURL(%q) succeeded", raw)
		}
	}
}

// A parameter that names where a secret is kept (an environment variable,
// a file) is not a secret and is shown; the secrets beside it are not.
func TestWhereASecretIsKeptIsShown(t *testing.T) {
	for in, want := range map[string]string{
		"webhook://127.0.0.1:8080/hooks/stripe?verify=stripe&secret_env=STRIPE_SECRET&park_dir=/var/lib/p": "webhook://127.0.0.1:8080/hooks/stripe?verify=stripe&secret_env=STRIPE_SECRET&park_dir=/var/lib/p",
		"webhook://h:1/x?secret_file=/run/secrets/stripe&secret=whsec_abc":                                 "webhook://h:1/x?secret_file=/run/secrets/stripe&secret=xxxxx",
		"kafka://u:pw@b:9092/t?sasl_password=hunter2&key_file=/etc/kafka/client.key":                       "kafka://u:xxxxx@b:9092/t?sasl_password=xxxxx&key_file=/etc/kafka/client.key",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
	for name, secret := range map[string]bool{
		"secret_env": false, "secret_file": false, "SECRET_FILE": false, "key_file": false, "password_file": false,
		"secret": true, "sasl_password": true, "token": true, "secret_envelope": true, "file_secret": true,
	} {
		if got := SecretParam(name); got != secret {
			t.Errorf("SecretParam(%q) = %v, want %v", name, got, secret)
		}
	}
}
