package main

import (
	"net/url"
	"testing"

	"github.com/idemq/idemq/internal/servicetest"
)

func TestKillAndRestartSQSPostgres(t *testing.T) {
	t.Parallel()
	endpoint := servicetest.SQSEndpoint(t)
	store, prefix, l := postgresStore(t)
	queue, dlq := servicetest.SQSQueues(t, endpoint, "payments-")
	// A short visibility timeout: what a killed consumer held comes back
	// quickly (the heartbeat keeps extending it for a live one). A short
	// long-poll wait: a graceful stop waits for the polls in flight (20s
	// at the default wait).
	broker := "sqs://test:test@" + queue + "?" + url.Values{
		"endpoint": {endpoint}, "region": {"us-east-1"}, "dlq": {dlq}, "visibility": {"5s"}, "wait": {"1s"},
	}.Encode()
	runKillAndRestart(t, killRun{
		broker: broker, store: store, tables: prefix, ledger: l,
		messages: killMessages(t), duplicates: 0.2, kills: 3, batch: 10, concurrency: 2,
	})
}
