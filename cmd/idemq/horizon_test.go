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
	"github.com/idemq/idemq/stores/sqlite"
)

// stats --broker compares the store's retention with the broker's
// redelivery horizon: a RabbitMQ queue keeps messages until consumed, so
// any retention is too short; an SQS queue keeping messages 30 minutes is
// outlived by claims kept an hour, and so is a Kafka topic keeping records
// 30 minutes.
func TestStatsAgainstBrokerHorizon(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.db")
	storeURL := "sqlite://" + path + "?retention=1h"
	expect(t, exitOK, []string{"migrate", "--store", storeURL})

	amqpURL := servicetest.RabbitMQURL(t)
	q := "idemq-stats-" + randomHex(4)
	servicetest.DeleteQueuesAtCleanup(t, amqpURL, q)
	broker := amqpURL + "?queue=" + q
	expect(t, exitOK, []string{"stats", "--store", storeURL, "--broker", broker},
		"retention 1h0m0s", "redelivery horizon of", "unbounded", "TOO SHORT")
	r := expect(t, exitOK, []string{"stats", "--store", storeURL, "--broker", broker, "--json"})
	var out struct{ Horizons []horizonCheck }
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.Horizons) != 1 || !out.Horizons[0].Short || out.Horizons[0].Horizon != "unbounded" {
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

	// One --broker per consumer: the verdict stands in that consumer's row.
	topic := "idemq-stats-" + randomHex(4)
	bs := servicetest.KafkaTopics(t, 1, topic)
	servicetest.SetTopicConfig(t, bs, topic, "retention.ms", "1800000")
	kafkaURL := "kafka://" + bs + "/" + topic + "?group=stats-" + randomHex(3)
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	claimN(t, s, "orders", 2)
	claimN(t, s, "ledger", 3)
	claimN(t, s, "mail", 1)
	s.Close()
	r = expect(t, exitOK, []string{"stats", "--store", storeURL, "--broker", "orders=" + broker,
		"--broker", "ledger=" + kafkaURL, "--broker", "ghost=" + sqsURL},
		"HORIZON", "consumer orders: retention 1h0m0s", "consumer ledger: retention 1h0m0s", "(no claims yet)")
	rows := map[string]string{}
	for _, line := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = line
		}
	}
	for consumer, want := range map[string]string{"orders": "unbounded TOO SHORT", "ledger": "30m0s ok", "mail": " -"} {
		if !strings.HasSuffix(rows[consumer], want) {
			t.Errorf("the row of %s does not end in %q:\n%s", consumer, want, r.stdout)
		}
	}
	r = expect(t, exitOK, []string{"stats", "--store", storeURL, "--broker", "orders=" + broker, "--broker", "ledger=" + kafkaURL, "--json"})
	out.Horizons = nil
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.Horizons) != 2 ||
		out.Horizons[0].Consumer != "orders" || !out.Horizons[0].Short ||
		out.Horizons[1].Consumer != "ledger" || out.Horizons[1].Short || out.Horizons[1].Horizon != "30m0s" {
		t.Errorf("--json: %+v, %v\n%s", out, err, r.stdout)
	}

	expect(t, exitUsage, []string{"stats", "--store", storeURL, "--broker"}, "flag needs an argument")
	secret := "s3cr3t" + randomHex(4)
	r = expect(t, exitUsage, []string{"stats", "--store", storeURL, "--broker", "=amqp://guest:" + secret + "@127.0.0.1:5672/"}, "want CONSUMER=URL or URL")
	if strings.Contains(r.String(), secret) {
		t.Errorf("a refused --broker shows its password:\n%s", r)
	}
	expect(t, exitFailure, []string{"stats", "--store", storeURL, "--broker", "stomp://x"}, "no broker registered")
}
