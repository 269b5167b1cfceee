package main

import (
	"context"
	"net/url"
	"os"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemq/idemq/internal/servicetest"
)

// fauxqsDir is where the SQS adapter's tests keep the fauxqs emulator
// (installed there by `npm ci`); this test starts it the same way.
const fauxqsDir = "../../brokers/sqs/internal/fauxqs"

// sqsEndpoint returns IDEMQ_SQS_URL, or starts fauxqs on a free loopback
// port for this test (it exits when its standard input, held by this
// process, closes). Without either the test is skipped, or fails with
// IDEMQ_REQUIRE_SERVICES=1.
func sqsEndpoint(t *testing.T) string {
	t.Helper()
	if u := os.Getenv("IDEMQ_SQS_URL"); u != "" {
		return u
	}
	f, err := servicetest.StartFauxqs(fauxqsDir)
	if err != nil {
		unavailable(t, "IDEMQ_SQS_URL", "(unset; fauxqs not started from brokers/sqs/internal/fauxqs)", err)
	}
	t.Cleanup(f.Stop)
	return f.URL
}

// sqsQueues creates a queue and its dead-letter queue, deleted when the
// test ends, and returns their names.
func sqsQueues(t *testing.T, endpoint string) (queue, dlq string) {
	t.Helper()
	cl := awssqs.New(awssqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
	ctx := context.Background()
	queue = "payments-" + randomHex(4)
	dlq = queue + "-dlq"
	for _, name := range []string{dlq, queue} {
		out, err := cl.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name)})
		if err != nil {
			t.Fatalf("create queue %s: %v", name, err)
		}
		t.Cleanup(func() { cl.DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: out.QueueUrl}) })
	}
	return queue, dlq
}

func TestKillAndRestartSQSPostgres(t *testing.T) {
	t.Parallel()
	endpoint := sqsEndpoint(t)
	store, prefix, l := postgresStore(t)
	queue, dlq := sqsQueues(t, endpoint)
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
