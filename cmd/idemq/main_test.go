package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/outbox/sqliteoutbox"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/sqlite"
)

// result is one in-process run of the command line.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

func idemq(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

// expect runs args and checks the exit code and that each want string is
// in stdout or stderr.
func expect(t *testing.T, code int, args []string, want ...string) result {
	t.Helper()
	r := idemq(t, args...)
	if r.code != code {
		t.Fatalf("idemq %s: exit %d, want %d\n%s", strings.Join(args, " "), r.code, code, r)
	}
	for _, w := range want {
		if !strings.Contains(r.stdout+r.stderr, w) {
			t.Fatalf("idemq %s: output lacks %q\n%s", strings.Join(args, " "), w, r)
		}
	}
	return r
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func TestUsageAndHelp(t *testing.T) {
	expect(t, exitUsage, nil, "Commands:")
	r := expect(t, exitOK, []string{"--help"}, "migrate", "prune", "stats", "lookup", "forget", "Exit codes")
	if r.stderr != "" {
		t.Errorf("--help wrote to stderr: %q", r.stderr)
	}
	expect(t, exitOK, []string{"help", "prune"}, "Usage: idemq prune", "--older-than")
	for _, sub := range []string{"list", "groups", "show", "redrive", "purge"} {
		expect(t, exitOK, []string{"dlq", sub, "--help"}, "Usage: idemq dlq "+sub, "-broker")
	}
	for _, c := range commands() {
		r := expect(t, exitOK, []string{c.name, "--help"}, "Usage: idemq "+c.name, "-store")
		if r.stderr != "" {
			t.Errorf("%s --help wrote to stderr: %q", c.name, r.stderr)
		}
	}
	db := "sqlite://" + filepath.Join(t.TempDir(), "u.db")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"bench"}, `unknown command "bench"`}, // the bench module's idemq-bench
		{[]string{"stats"}, "--store is required"},
		{[]string{"migrate", "--store", "not a url"}, "is not a URL"},
		{[]string{"stats", "--store", db, "extra"}, `unexpected argument "extra"`},
		{[]string{"stats", "--nope"}, "flag provided but not defined"},
		{[]string{"prune", "--store", db}, "--older-than is required"},
		{[]string{"prune", "--store", db, "--older-than", "-1h"}, "--older-than is required and must be positive"},
		{[]string{"prune", "--store", db, "--older-than", "soon"}, "invalid value"},
		{[]string{"prune", "--store", db, "--older-than", "200h", "--batch", "0"}, "--batch 0"},
		{[]string{"prune", "--store", db, "--older-than", "1h"}, "shorter than the store's retention 168h"},
		{[]string{"lookup", "--store", db, "m-1"}, "--consumer is required"},
		{[]string{"lookup", "--store", db, "--consumer", "c"}, "give at least one message id"},
		{[]string{"lookup", "--consumer", "c", "m-1"}, "--store is required"},
		{[]string{"lookup", "--store", db, "--consumer", "c", "m-1", "--nope"}, "flag provided but not defined"},
		{[]string{"forget", "--store", db, "--consumer", "c", "m-1"}, "pass --yes"},
		{[]string{"dlq"}, "give a subcommand"},
		{[]string{"dlq", "peek"}, `unknown subcommand "peek"`},
		{[]string{"dlq", "list"}, "--broker is required"},
		{[]string{"dlq", "list", "--broker", "not a url"}, "is not a URL"},
		{[]string{"dlq", "list", "--broker", "amqp://h/?queue=q", "--older-than", "-1h"}, "must be positive"},
		{[]string{"dlq", "show", "--broker", "amqp://h/?queue=q"}, "exactly one message id"},
		{[]string{"dlq", "redrive", "--broker", "amqp://h/?queue=q", "--store", db, "--retention", "1h"}, "not both"},
		{[]string{"dlq", "purge", "--broker", "amqp://h/?queue=q", "--all", "--id", "x", "--yes"}, "not both"},
	} {
		r := expect(t, exitUsage, c.args, c.want)
		if r.stdout != "" {
			t.Errorf("idemq %s: a usage error wrote to stdout: %q", strings.Join(c.args, " "), r.stdout)
		}
	}
	// A store nobody registered is a failure, not a usage error, and the
	// message says which schemes exist.
	expect(t, exitFailure, []string{"stats", "--store", "oracle://db/x"}, "registered: ", "postgres", "sqlite")
}

func TestSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ops.db")
	storeURL := "sqlite://" + path + "?table=claims"
	expect(t, exitOK, []string{"migrate", "--store", storeURL}, "dedup table claims is ready")
	expect(t, exitOK, []string{"migrate", "--store", storeURL}, "is ready") // idempotent
	expect(t, exitOK, []string{"stats", "--store", storeURL}, "0 claims", "no claims")

	now := time.Now()
	old := now.Add(-200 * time.Hour)
	ctx := context.Background()
	for _, c := range []struct {
		at       time.Time
		consumer string
		n        int
	}{{old, "billing", 10}, {now.Add(-time.Minute), "billing", 2}, {now.Add(-time.Minute), "audit", 3}} {
		s, err := sqlite.Open(ctx, path, sqlite.WithTable("claims"), sqlite.WithClock(func() time.Time { return c.at }))
		if err != nil {
			t.Fatal(err)
		}
		claimN(t, s, c.consumer, c.n)
		s.Close()
	}

	r := expect(t, exitOK, []string{"stats", "--store", storeURL}, "15 claims", "KiB on disk", "CONSUMER", "audit", "billing")
	if !strings.Contains(r.stdout, old.UTC().Format("2006-01-02T15:04")) {
		t.Errorf("stats does not show billing's oldest claim %v:\n%s", old.UTC(), r.stdout)
	}
	r = expect(t, exitOK, []string{"stats", "--store", storeURL, "--json"})
	var st struct {
		Store string
		admin.TableStats
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, r.stdout)
	}
	if st.Table != "claims" || st.Rows != 15 || len(st.Consumers) != 2 || st.Consumers[1].Consumer != "billing" || st.Consumers[1].Rows != 12 {
		t.Errorf("stats --json: %+v", st)
	}

	// 10 old claims in batches of 3: 3, 3, 3, 1.
	r = expect(t, exitOK, []string{"prune", "--store", storeURL, "--older-than", "168h", "--batch", "3", "--progress=false"},
		"pruned 10 claims", "in 4 batches", "batch 1: pruned 3 (total 3)", "batch 4: pruned 1 (total 10)")
	r = expect(t, exitOK, []string{"stats", "--store", storeURL, "--json"})
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatal(err)
	}
	if st.Rows != 5 {
		t.Errorf("after pruning: %d claims, want the 5 recent ones", st.Rows)
	}
	// Nothing left to prune: one short batch, exit 0.
	expect(t, exitOK, []string{"prune", "--store", storeURL, "--older-than", "168h", "--progress=false"}, "pruned 0 claims", "in 1 batches")
	// Inside the retention only with --force.
	expect(t, exitOK, []string{"prune", "--store", storeURL, "--older-than", "1s", "--force", "--progress=false"}, "pruned 5 claims")
}

// claimN commits n fresh claims for consumer through the store.
func claimN[Tx any](t *testing.T, s driver.Store[Tx], consumer string, n int) {
	t.Helper()
	ctx := context.Background()
	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	claims := make([]driver.Claim, n)
	for i := range claims {
		claims[i] = driver.Claim{ID: "m-" + randomHex(6)}
	}
	if _, err := txn.Claim(ctx, consumer, claims); err != nil {
		t.Fatal(err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// postgresURL returns IDEMQ_POSTGRES_URL (default the local server), or
// skips (fails with IDEMQ_REQUIRE_SERVICES=1) when it is unreachable.
func postgresURL(t *testing.T) string {
	t.Helper()
	return servicetest.PostgresURL(t)
}

// withSecret puts a password into a URL that has none, so tests can check
// it never shows; the local server's trust authentication ignores it.
func withSecret(u, secret string) string {
	if strings.Contains(u, "@") && !strings.Contains(strings.SplitN(strings.SplitN(u, "://", 2)[1], "@", 2)[0], ":") {
		return strings.Replace(u, "@", ":"+secret+"@", 1)
	}
	return u
}

func TestPostgres(t *testing.T) {
	base := postgresURL(t)
	const secret = "Sup3rS3cretPW"
	table := "idemq_cli_" + randomHex(4)
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	storeURL := withSecret(base, secret) + sep + "table=" + table
	ctx := context.Background()
	t.Cleanup(func() {
		if conn, err := pgx.Connect(ctx, base); err == nil {
			conn.Exec(ctx, `DROP TABLE IF EXISTS `+table+`, `+table+`_leases`)
			conn.Close(ctx)
		}
	})
	var outputs []result
	outputs = append(outputs, expect(t, exitOK, []string{"migrate", "--store", storeURL}, "dedup table "+table+" is ready"))

	now := time.Now()
	for _, c := range []struct {
		at time.Time
		n  int
	}{{now.Add(-10 * 24 * time.Hour), 25}, {now, 4}} {
		s, err := postgres.Open(ctx, base, postgres.WithTable(table), postgres.WithClock(func() time.Time { return c.at }))
		if err != nil {
			t.Fatal(err)
		}
		claimN(t, s, "payments", c.n)
		s.Close()
	}
	outputs = append(outputs,
		expect(t, exitOK, []string{"stats", "--store", storeURL}, "29 claims", "payments", "10.0d"),
		expect(t, exitOK, []string{"prune", "--store", storeURL, "--older-than", "168h", "--batch", "10", "--progress=false"},
			"pruned 25 claims", "in 3 batches", "batch 3: pruned 5 (total 25)"),
		expect(t, exitOK, []string{"stats", "--store", storeURL}, "4 claims"),
		// Failures: a server that is not there, a table that is not a
		// dedup table.
		expect(t, exitFailure, []string{"stats", "--store", "postgres://postgres:" + secret + "@127.0.0.1:1/test"}, "idemq stats:", "connect"),
		expect(t, exitFailure, []string{"migrate", "--store", withSecret(base, secret) + sep + "table=bad-name"}, "table name"),
	)
	for _, r := range outputs {
		if strings.Contains(r.stdout+r.stderr, secret) {
			t.Errorf("output shows the password:\n%s", r)
		}
	}
}

// TestExitCodesOfTheBinary runs the built command, so the codes scripts
// see are checked, not only run's return value.
func TestExitCodesOfTheBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "idemq")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	db := "sqlite://" + filepath.Join(t.TempDir(), "x.db")
	amqp := servicetest.RabbitMQURL(t)
	q := "idemq-exit-" + randomHex(4)
	servicetest.DeleteQueuesAtCleanup(t, amqp, q, q+".dlq")
	broker := amqp + "?queue=" + q
	outboxPath := filepath.Join(t.TempDir(), "outbox.db")
	odb, err := sql.Open("sqlite", outboxPath)
	if err != nil {
		t.Fatal(err)
	}
	o, err := sqliteoutbox.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(context.Background(), odb); err != nil {
		t.Fatal(err)
	}
	odb.Close()
	outboxDB := "sqlite://" + outboxPath
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"migrate", "--store", db}, 0},
		{[]string{"stats", "--store", db}, 0},
		{[]string{"prune", "--help"}, 0},
		{[]string{"prune", "--store", db}, 2},
		{[]string{"frobnicate"}, 2},
		{[]string{"lookup", "--store", db, "--consumer", "c", "m-1"}, 0},
		{[]string{"forget", "--store", db, "--consumer", "c", "m-1"}, 2},
		{[]string{"forget", "--store", db, "--consumer", "c", "--yes", "m-1"}, 0},
		{[]string{"stats", "--store", "sqlite:///nonexistent-dir-" + randomHex(4) + "/x.db"}, 1},
		{[]string{"dlq", "list", "--broker", broker}, 1},          // no such dead-letter queue yet
		{[]string{"stats", "--store", db, "--broker", broker}, 0}, // declares the queues, as the consumer would
		{[]string{"dlq", "list", "--broker", broker}, 0},
		{[]string{"dlq", "show", "--broker", broker, "m-1"}, 1},
		{[]string{"dlq", "purge", "--broker", broker, "--all"}, 2},
		{[]string{"dlq", "purge", "--broker", broker, "--all", "--yes"}, 0},
		{[]string{"dlq", "redrive", "--broker", broker}, 2},
		{[]string{"dlq", "redrive", "--broker", broker, "--retention", "1h"}, 0},
		{[]string{"dlq", "list", "--broker", "stomp://x"}, 1},
		{[]string{"outbox", "stats", "--store", outboxDB}, 0},
		{[]string{"outbox", "list", "--store", outboxDB, "--json"}, 0},
		{[]string{"outbox", "purge", "--store", outboxDB, "--all"}, 2},
		{[]string{"outbox", "purge", "--store", outboxDB, "--all", "--yes"}, 0},
		{[]string{"outbox", "stats", "--store", "sqlite:///nonexistent-dir-" + randomHex(4) + "/x.db"}, 1},
		{[]string{"outbox", "frobnicate"}, 2},
	} {
		err := exec.Command(bin, c.args...).Run()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.code {
			t.Errorf("idemq %s: exit %d, want %d", strings.Join(c.args, " "), code, c.code)
		}
	}
}

// idemq --help and the operating guide's table of dead letters name every
// source the project has, each with its URL scheme.
func TestHelpNamesEverySource(t *testing.T) {
	r := expect(t, exitOK, []string{"--help"})
	for _, w := range []string{"RabbitMQ", "amqp://", "Kafka", "kafka://", "consumer groups", "Kafka share groups", "kafka+share://",
		"SQS", "sqs://", "Google Pub/Sub", "pubsub://", "NATS JetStream", "nats://", "Redis Streams", "redis://", "Webhooks", "webhook://", "mem://"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("idemq --help does not name %q:\n%s", w, r.stdout)
		}
	}
	guide, err := os.ReadFile(filepath.Join("..", "..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(guide), "| | reading without consuming |")
	if !ok {
		t.Fatal("docs/operating.md has no table of how each broker reads its dead letters")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	rows := map[string]bool{}
	for _, line := range strings.Split(table, "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 {
			rows[strings.TrimSpace(cells[1])] = true
		}
	}
	for _, source := range []string{"RabbitMQ (`amqp://`)", "Kafka (`kafka://`)", "Kafka share groups (`kafka+share://`)", "SQS (`sqs://`)",
		"Google Cloud Pub/Sub (`pubsub://`)",
		"NATS JetStream (`nats://`)", "Redis Streams (`redis://`)", "Webhooks (`webhook://`)", "in-process (`mem://`)"} {
		if !rows[source] {
			t.Errorf("docs/operating.md's dead-letter table has no row %q; its rows: %v", source, rows)
		}
	}
}

// The sources whose dead letters the command does not open by their own
// URL get a usage error that says what to give instead.
func TestDLQBrokerHints(t *testing.T) {
	storeURL := "sqlite://" + filepath.Join(t.TempDir(), "ops.db")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"dlq", "redrive", "--broker", "mem://u:pw@orders", "--force"}, []string{"memory broker", "memory.Broker.DeadLetters"}},
		{[]string{"console", "--store", storeURL, "--broker", "billing=mem://orders"}, []string{"memory broker"}},
	} {
		r := expect(t, exitUsage, c.args, c.want...)
		if strings.Contains(r.stdout+r.stderr, ":pw@") {
			t.Errorf("idemq %s shows the password:\n%s", strings.Join(c.args, " "), r)
		}
	}
}
