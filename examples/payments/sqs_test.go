package main

import (
	"net/url"
	"testing"

	"github.com/idemq/idemq/internal/servicetest"
)

func TestKillAndRestartSQSPostgres(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	runKillAndRestart(t, onSQS(t, killRun{
		store: store, tables: prefix, ledger: l,
		messages: killMessages(t), duplicates: 0.2, kills: 3, batch: 10, concurrency: 2,
	}))
}

// onSQS points r at a fresh queue and its dead-letter queue.
func onSQS(t *testing.T, r killRun) killRun {
	endpoint := servicetest.SQSEndpoint(t)
	queue, dlq := servicetest.SQSQueues(t, endpoint, "payments-")
	// A short visibility timeout: what a killed consumer held comes back
	// quickly (the heartbeat keeps extending it for a live one). A short
	// long-poll wait: a graceful stop waits for the polls in flight (20s
	// at the default wait).
	r.broker = "sqs://test:test@" + queue + "?" + url.Values{
		"endpoint": {endpoint}, "region": {"us-east-1"}, "dlq": {dlq}, "visibility": {"5s"}, "wait": {"1s"},
	}.Encode()
	return r
}
