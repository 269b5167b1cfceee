package main

import (
	"context"
	"encoding/json"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemq/idemq/internal/servicetest"
)

// stats --broker compares the store's retention with the broker's
// redelivery horizon: a RabbitMQ queue keeps messages until consumed, so
// any retention is too short; an SQS queue keeping messages 30 minutes is
// outlived by claims kept an hour.
func TestStatsAgainstBrokerHorizon(t *testing.T) {
	storeURL := "sqlite://" + filepath.Join(t.TempDir(), "h.db") + "?retention=1h"
	expect(t, exitOK, []string{"migrate", "--store", storeURL})

	amqpURL := servicetest.RabbitMQURL(t)
	q := "idemq-stats-" + randomHex(4)
	servicetest.DeleteQueuesAtCleanup(t, amqpURL, q)
	broker := amqpURL + "?queue=" + q
	expect(t, exitOK, []string{"stats", "--store", storeURL, "--broker", broker},
		"retention 1h0m0s", "redelivery horizon of", "unbounded", "TOO SHORT")
	r := expect(t, exitOK, []string{"stats", "--store", storeURL, "--broker", broker, "--json"})
	var out struct{ Horizon horizonCheck }
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || !out.Horizon.Short || out.Horizon.Horizon != "unbounded" {
		t.Errorf("--json: %+v, %v\n%s", out, err, r.stdout)
	}
	if strings.Contains(r.stdout, "guest:guest") {
		t.Errorf("the output shows the broker's password:\n%s", r.stdout)
	}

	endpoint := servicetest.SQSEndpoint(t)
	cl := servicetest.SQSClient(endpoint)
	name := "idemq-stats-" + randomHex(4)
	for _, n := range []string{name, name + "-dlq"} {
		if _, err := cl.CreateQueue(context.Background(), &awssqs.CreateQueueInput{QueueName: aws.String(n),
			Attributes: map[string]string{"MessageRetentionPeriod": "1800"}}); err != nil {
			t.Fatal(err)
		}
	}
	sqsURL := "sqs://test:test@" + name + "?" + url.Values{"endpoint": {endpoint}, "region": {"us-east-1"}, "dlq": {name + "-dlq"}}.Encode()
	expect(t, exitOK, []string{"stats", "--store", storeURL, "--broker", sqsURL},
		"retention 1h0m0s", "30m0s", "claims outlive redeliveries")
	// A stream without MaxAge keeps messages until they are consumed.
	nu := servicetest.NATSURL(t)
	stream := "STATS_" + strings.ToUpper(randomHex(4))
	servicetest.DeleteStreamsAtCleanup(t, nu, stream, stream+"_DLQ")
	expect(t, exitOK, []string{"stats", "--store", storeURL, "--broker", nu + "/" + stream + "?consumer=c&subject=stats." + randomHex(4)},
		"retention 1h0m0s", "unbounded", "TOO SHORT")
	expect(t, exitUsage, []string{"stats", "--store", storeURL, "--broker"}, "flag needs an argument")
	expect(t, exitFailure, []string{"stats", "--store", storeURL, "--broker", "stomp://x"}, "no broker registered")
}
