package core_test

import (
	"context"
	"database/sql"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
)

func TestRedact(t *testing.T) {
	cases := map[string]string{
		"amqp://guest:s3cret@host:5672/vh":                 "amqp://guest:xxxxx@host:5672/vh",
		"postgres://u:p%40ss@db/app?sslmode=verify-full":   "postgres://u:xxxxx@db/app?sslmode=verify-full",
		"kafka://b:9092/t?sasl_password=hunter2&group=g":   "kafka://b:9092/t?sasl_password=xxxxx&group=g",
		"sqs://q?access_key=AKIA&secret_key=abc&region=eu": "sqs://q?access_key=xxxxx&secret_key=xxxxx&region=eu",
		"mysql://root:pw@tcp(127.0.0.1:3306)/test":         "mysql://root:xxxxx@tcp(127.0.0.1:3306)/test",
		"amqp://host:5672/":                                "amqp://host:5672/",
		"postgres://u:p ss@bad host/%zz":                   "postgres://u:xxxxx@bad host/%zz",
		"x://h/?token=abc#frag":                            "x://h/?token=xxxxx#frag",
		"mem://payments":                                   "mem://payments",
		// Found by FuzzRedact: url.Parse takes the password up to the last
		// '@', and an unparseable URL may hold a raw '/'.
		"postgres://app:p@ss:w%2Frd@db/db": "postgres://app:xxxxx@db/db",
		"amqp://u:pa/ss@h:5672/":           "amqp://u:xxxxx@h:5672/",
		"amqp://u@h:5672/":                 "amqp://u@h:5672/",
	}
	for in, want := range cases {
		if got := core.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOpenByURL(t *testing.T) {
	ctx := context.Background()
	dbURL := "sqlite://" + filepath.Join(t.TempDir(), "u.db") + "?table=dedup&retention=24h"
	store, err := core.OpenStore[*sql.Tx](ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := store.(driver.Retentioner); !ok || r.Retention().Hours() != 24 {
		t.Errorf("retention parameter not applied")
	}
	pub, err := core.OpenPublisher(ctx, "mem://url-test?broker=open-test")
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, "", &core.Message{ID: "a", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	src, err := core.OpenSource(ctx, "mem://url-test?broker=open-test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Start(ctx, driver.Setup{Window: 1, Logger: slog.Default()}); err != nil {
		t.Fatal(err)
	}
	ms, err := src.(driver.Puller).Receive(ctx, 1)
	if err != nil || len(ms) != 1 || ms[0].ID != "a" {
		t.Fatalf("received %v, %v", ms, err)
	}
	if err := src.Ack(ctx, ms); err != nil {
		t.Fatal(err)
	}
	src.Close()
}

func TestOpenErrorsNameTheProblemAndHideSecrets(t *testing.T) {
	cases := []struct {
		url, want string
		open      func(string) error
	}{
		{"nats://u:topsecret@h/q", `no broker registered for scheme "nats"`, openSrc},
		{"payments", "has no scheme", openSrc},
		{"mem://q?bogus=1", `unknown parameter "bogus"`, openSrc},
		{"mem://", "no queue name", openSrc},
		{"redis://u:topsecret@h", `no store registered for scheme "redis"`, openSQLStore},
		{"sqlite://x.db?retention=forever", "retention", openSQLStore},
		{"sqlite://x.db?table=a%3Bdrop", "WithTable", openSQLStore},
		{"sqlite://x.db?table=a;drop", "semicolon", openSQLStore},
		{"post gres://u:topsecret@h", "invalid URL", openSrc},
		{"postgres://u:topsecret@h:99999999/x\x7f", "invalid URL", openSQLStore},
	}
	for _, tc := range cases {
		err := tc.open(tc.url)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.url, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "topsecret") {
			t.Errorf("%q: error leaks the password: %v", tc.url, err)
		}
	}
}

func openSrc(u string) error {
	s, err := core.OpenSource(context.Background(), u)
	if err == nil {
		s.Close()
	}
	return err
}

func openSQLStore(u string) error {
	_, err := core.OpenStore[*sql.Tx](context.Background(), u)
	return err
}

type otherTx struct{}

func TestOpenStoreChecksTheTransactionType(t *testing.T) {
	_, err := core.OpenStore[otherTx](context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "t.db"))
	if err == nil || !strings.Contains(err.Error(), "*sql.Tx") || !strings.Contains(err.Error(), "core_test.otherTx") {
		t.Errorf("error %v, want one naming both transaction types", err)
	}
}
