package main

import "testing"

// TestBenchSchemes checks that bench --help lists every broker and store
// scheme the benchmark runs, and that a scheme it cannot run, or a batch
// larger than SQS allows, is a usage error naming the field, before any
// connection is tried.
func TestBenchSchemes(t *testing.T) {
	expect(t, exitOK, []string{"bench", "--help"}, "amqp://", "kafka://", "sqs://", "postgres://", "mysql://", "-broker", "-store")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--broker", "amqp://h/", "--store", "sqlite:///tmp/x.db"}, `Config.Store: scheme "sqlite" is not supported (postgres, postgresql, mysql)`},
		{[]string{"bench", "--broker", "nats://h:4222/t", "--store", "mysql://root@h/db"}, `Config.Broker: scheme "nats" is not supported (amqp, amqps, kafka, sqs)`},
		{[]string{"bench", "--broker", "sqs://q?endpoint=http://127.0.0.1:1", "--store", "mysql://root@h/db", "--batch", "11"}, "Config.BatchSize: 11 is outside 1..10 (for sqs://)"},
		{[]string{"bench", "--broker", "amqp://h/", "--store", "mysql://root@h/db", "--batch", "0"}, "--batch 0"},
	} {
		expect(t, exitUsage, c.args, c.want)
	}
}
