package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/servicetest"
)

// result is one in-process run of the command line.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// expect runs args and checks the exit code and that each want string is
// in stdout or stderr.
func expect(t *testing.T, code int, args []string, want ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	r := result{run(context.Background(), args, &out, &errOut), "", ""}
	r.stdout, r.stderr = out.String(), errOut.String()
	if r.code != code {
		t.Fatalf("idemq-bench %s: exit %d, want %d\n%s", strings.Join(args, " "), r.code, code, r)
	}
	for _, w := range want {
		if !strings.Contains(r.stdout+r.stderr, w) {
			t.Fatalf("idemq-bench %s: output lacks %q\n%s", strings.Join(args, " "), w, r)
		}
	}
	return r
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// withSecret puts a password into a URL that has none, so tests can check
// it never shows; the local server's trust authentication ignores it.
func withSecret(u, secret string) string {
	if strings.Contains(u, "@") && !strings.Contains(strings.SplitN(strings.SplitN(u, "://", 2)[1], "@", 2)[0], ":") {
		return strings.Replace(u, "@", ":"+secret+"@", 1)
	}
	return u
}

func TestUsageAndHelp(t *testing.T) {
	r := expect(t, exitOK, []string{"--help"}, "Usage: idemq-bench --broker URL", "-store", "-broker")
	if r.stderr != "" {
		t.Errorf("--help wrote to stderr: %q", r.stderr)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--store is required"},
		{[]string{"--store", "postgres://x/y"}, "--broker is required"},
		{[]string{"--store", "postgres://x/y", "--broker", "amqp://h/?queue=q", "-n", "0"}, "-n 0"},
		{[]string{"--store", "postgres://x/y", "--broker", "mqtt://h:1883/t", "-n", "10"}, `Config.Broker: scheme "mqtt" is not supported`},
		{[]string{"--store", "not a url", "--broker", "amqp://h/?queue=q"}, "is not a URL"},
		{[]string{"--store", "postgres://x/y", "--broker", "amqp://h/?queue=q", "extra"}, `unexpected argument "extra"`},
		{[]string{"--nope"}, "flag provided but not defined"},
	} {
		r := expect(t, exitUsage, c.args, c.want, "Run 'idemq-bench --help' for usage.")
		if r.stdout != "" {
			t.Errorf("idemq-bench %s: a usage error wrote to stdout: %q", strings.Join(c.args, " "), r.stdout)
		}
	}
}

// TestBenchSchemes checks that --help lists every broker and store scheme
// the benchmark runs, and that a scheme it cannot run, or a batch larger
// than SQS allows, is a usage error naming the field, before any
// connection is tried.
func TestBenchSchemes(t *testing.T) {
	expect(t, exitOK, []string{"--help"}, "amqp://", "kafka://", "sqs://", "nats://", "redis://", "rediss://", "postgres://", "mysql://", "-broker", "-store")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--broker", "amqp://h/", "--store", "sqlite:///tmp/x.db"}, `Config.Store: scheme "sqlite" is not supported (postgres, postgresql, mysql)`},
		{[]string{"--broker", "mqtt://h:1883/t", "--store", "mysql://root@h/db"}, `Config.Broker: scheme "mqtt" is not supported (amqp, amqps, kafka, sqs, pubsub, nats, redis, rediss)`},
		{[]string{"--broker", "nats://h:4222/t?subject=x", "--store", "mysql://root@h/db"}, "Config.Broker: the nats:// parameter subject is set per run"},
		{[]string{"--broker", "redis://h:6379/t?group=g", "--store", "mysql://root@h/db"}, "Config.Broker: the redis:// parameter group is set per run"},
		{[]string{"--broker", "sqs://q?endpoint=http://127.0.0.1:1", "--store", "mysql://root@h/db", "--batch", "11"}, "Config.BatchSize: 11 is outside 1..10 (for sqs://)"},
		{[]string{"--broker", "amqp://h/", "--store", "mysql://root@h/db", "--batch", "0"}, "--batch 0"},
	} {
		expect(t, exitUsage, c.args, c.want)
	}
}

// TestBench runs a tiny benchmark against RabbitMQ and Postgres: the table
// comes out with throughput and latency for the baseline and idemq, every
// run passes its correctness check, and no credential shows.
func TestBench(t *testing.T) {
	pg := servicetest.PostgresURL(t)
	amqpURL := servicetest.RabbitMQURL(t)
	const secret = "Sup3rS3cretPW"
	sep := "?"
	if strings.Contains(amqpURL, "?") {
		sep = "&"
	}
	r := expect(t, exitOK, []string{"--broker", amqpURL + sep + "queue=idemq-cli-bench-" + randomHex(3),
		"--store", withSecret(pg, secret), "-n", "300", "--repeat", "1", "--batch", "50",
		"--configs", "seed-p5,idemq-b1-w5,idemq-batch", "--latency-messages", "50", "--progress=false"},
		"msgs/s", "seed-p5", "idemq-b1-w5", "idemq-batch", "p99")
	if strings.Contains(r.stdout+r.stderr, secret) {
		t.Errorf("bench output shows the password:\n%s", r)
	}
	if strings.Contains(r.stdout, "FAILED") {
		t.Errorf("a configuration failed:\n%s", r)
	}
}
