package pgoutbox

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	kafkago "github.com/segmentio/kafka-go"

	_ "github.com/idemq/idemq/brokers/kafka" // kafka:// for the relay child
	_ "github.com/idemq/idemq/brokers/sqs"   // sqs:// for the relay child
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
)

// kafkaBrokers returns a broker list where topic (3 partitions) and
// topic.dlq exist: on IDEMQ_KAFKA_URL's hosts when it is set (the topics
// are created there and deleted when the test ends), else on a fresh kfake
// cluster (servicetest.StartKfake), a process of its own speaking the
// Kafka protocol on a loopback port, stopped when the test ends.
func kafkaBrokers(t *testing.T, topic string) string {
	t.Helper()
	raw := os.Getenv("IDEMQ_KAFKA_URL")
	if raw == "" {
		return servicetest.StartKfake(t, "-brokers", "1", "-topics", topic+":3,"+topic+".dlq:1", "-auto-create=false")
	}
	hosts := raw
	if u, err := url.Parse(raw); err == nil && u.Scheme == "kafka" {
		hosts = u.Host
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := &kafkago.Client{Addr: kafkago.TCP(strings.Split(hosts, ",")...)}
	if _, err := cl.Metadata(ctx, &kafkago.MetadataRequest{}); err != nil {
		servicetest.Unavailable(t, "service unreachable at IDEMQ_KAFKA_URL: %v", err)
	}
	resp, err := cl.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{
		{Topic: topic, NumPartitions: 3, ReplicationFactor: 1},
		{Topic: topic + ".dlq", NumPartitions: 1, ReplicationFactor: 1},
	}})
	if err != nil {
		t.Fatalf("create topics: %v", err)
	}
	for name, err := range resp.Errors {
		if err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
			t.Fatalf("create topic %s: %v", name, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cl.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: []string{topic, topic + ".dlq"}})
	})
	return hosts
}

// TestRelayProcessKilledKafka: the relay kill test with the relay
// publishing to Kafka (acks=all) and the consumer reading the topic in a
// group. All rows have one key, so one partition: in order.
func TestRelayProcessKilledKafka(t *testing.T) {
	if spec := os.Getenv("IDEMQ_OUTBOX_CHILD"); spec != "" {
		relayChild(t, spec)
		return
	}
	servicetest.PostgresURL(t) // skip before starting kfake when Postgres is missing
	topic := "idemq-outbox-kill-" + suffix()
	base := "kafka://" + kafkaBrokers(t, topic) + "/" + topic
	group := "kill-" + suffix()
	runRelayKill(t, relayKill{dest: topic, broker: base, ordered: true, source: func(ctx context.Context) (core.Source, error) {
		return core.OpenSource(ctx, base+"?group="+group+"&session_timeout=6s&heartbeat_interval=1s")
	}})
}

// fauxqsDir is where the SQS adapter's tests keep the fauxqs emulator
// (installed there by `npm ci`).
const fauxqsDir = "../../brokers/sqs/internal/fauxqs"

// sqsEndpoint returns IDEMQ_SQS_URL, or starts fauxqs on a free loopback
// port for this test. Without either the test is skipped, or fails with
// IDEMQ_REQUIRE_SERVICES=1.
func sqsEndpoint(t *testing.T) string {
	t.Helper()
	if u := os.Getenv("IDEMQ_SQS_URL"); u != "" {
		return u
	}
	f, err := servicetest.StartFauxqs(fauxqsDir)
	if err != nil {
		servicetest.Unavailable(t, "IDEMQ_SQS_URL unset and fauxqs not started from %s: %v", fauxqsDir, err)
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
	queue = "idemq-outbox-kill-" + suffix()
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

// TestRelayProcessKilledSQS: the relay kill test with the relay publishing
// to SQS (SendMessageBatch; a batch is confirmed when every entry
// succeeded). A standard queue does not keep order, so only exactly-once
// is checked.
func TestRelayProcessKilledSQS(t *testing.T) {
	if spec := os.Getenv("IDEMQ_OUTBOX_CHILD"); spec != "" {
		relayChild(t, spec)
		return
	}
	servicetest.PostgresURL(t) // skip before starting fauxqs when Postgres is missing
	endpoint := sqsEndpoint(t)
	queue, dlq := sqsQueues(t, endpoint)
	client := url.Values{"endpoint": {endpoint}, "region": {"us-east-1"}}
	pubURL := "sqs://test:test@" + queue + "?" + client.Encode()
	client.Set("dlq", dlq)
	client.Set("wait", "1s")
	srcURL := "sqs://test:test@" + queue + "?" + client.Encode()
	runRelayKill(t, relayKill{dest: queue, broker: pubURL, source: func(ctx context.Context) (core.Source, error) {
		return core.OpenSource(ctx, srcURL)
	}})
}
