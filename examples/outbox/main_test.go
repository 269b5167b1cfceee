package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/servicetest"
)

func postgresURL(t *testing.T) string {
	t.Helper()
	return servicetest.PostgresURL(t)
}

func amqpURL(t *testing.T) string {
	t.Helper()
	return servicetest.RabbitMQURL(t)
}

func unique() string {
	b := make([]byte, 5)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func runExample(t *testing.T, broker string) string {
	t.Helper()
	s, err := parseFlags([]string{"-postgres", postgresURL(t), "-broker", broker, "-n", "200", "-tables", "ex_" + unique(), "-timeout", "60s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	ok, err := run(context.Background(), s, &out)
	t.Log("\n" + out.String())
	if err != nil || !ok {
		t.Fatalf("example failed (%v)", err)
	}
	if !strings.Contains(out.String(), "invoices          200 for 200 orders, 0 orders invoiced twice") {
		t.Fatalf("unexpected summary:\n%s", out.String())
	}
	return out.String()
}

func TestExampleMemory(t *testing.T) {
	runExample(t, "mem://orders-"+unique())
}

func TestExampleRabbitMQ(t *testing.T) {
	url := amqpURL(t)
	q := "idemq-example-outbox-" + unique()
	servicetest.DeleteQueuesAtCleanup(t, url, q)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	runExample(t, url+sep+"queue="+q)
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-n", "0"}, {"-customers", "0"}, {"-writers", "-1"}} {
		if _, err := parseFlags(args, io.Discard); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("parseFlags(%v) = %v, want an error naming %s", args, err, args[0])
		}
	}
}

// kafkaBrokers returns a broker list where topic and topic.dlq exist: on
// IDEMQ_KAFKA_URL's hosts when it is set (the topics are created there and
// deleted when the test ends), else on a fresh kfake cluster
// (servicetest.StartKfake), a process of its own speaking the Kafka
// protocol on a loopback port, stopped when the test ends.
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

// The relay publishes to the URL's topic (acks=all) and the billing
// consumer reads it in a group of its own.
func TestExampleKafka(t *testing.T) {
	topic := "idemq-example-outbox-" + unique()
	brokers := kafkaBrokers(t, topic)
	runExample(t, "kafka://"+brokers+"/"+topic+"?group=billing-"+unique()+"&session_timeout=6s&heartbeat_interval=1s")
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
	queue = "idemq-example-outbox-" + unique()
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

// The relay publishes with SendMessageBatch; the consumer long-polls the
// same queue (a short wait, so that stopping does not wait 20s).
func TestExampleSQS(t *testing.T) {
	endpoint := sqsEndpoint(t)
	queue, dlq := sqsQueues(t, endpoint)
	runExample(t, "sqs://test:test@"+queue+"?"+url.Values{
		"endpoint": {endpoint}, "region": {"us-east-1"}, "dlq": {dlq}, "wait": {"1s"},
	}.Encode())
}
