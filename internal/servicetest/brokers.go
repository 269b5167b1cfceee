package servicetest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// SQSEndpoint returns IDEMQ_SQS_URL, or starts the fauxqs emulator (from
// brokers/sqs/internal/fauxqs, installed there by `npm ci`) on a free
// loopback port for this test, stopped when it ends. Without either t is
// skipped, or fails with IDEMQ_REQUIRE_SERVICES=1.
func SQSEndpoint(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(SQSEnv); u != "" {
		return u
	}
	dir := fauxqsDir()
	f, err := StartFauxqs(dir)
	if err != nil {
		Unavailable(t, "%s unset and fauxqs not started from %s: %v", SQSEnv, dir, err)
	}
	t.Cleanup(f.Stop)
	return f.URL
}

// fauxqsDir is brokers/sqs/internal/fauxqs of this checkout.
func fauxqsDir() string {
	dir, err := inCheckout(filepath.Join("brokers", "sqs", "internal", "fauxqs", "package.json"))
	if err != nil {
		return filepath.Join("brokers", "sqs", "internal", "fauxqs")
	}
	return dir
}

// SQSClient returns an SQS client of endpoint with the test credentials
// (test:test, us-east-1) the emulator takes.
func SQSClient(endpoint string) *awssqs.Client {
	return awssqs.New(awssqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
}

// SQSQueues creates a queue named prefix plus a random suffix and its
// dead-letter queue (the queue's name + "-dlq") on endpoint, deleted when
// the test ends, and returns their names.
func SQSQueues(t testing.TB, endpoint, prefix string) (queue, dlq string) {
	t.Helper()
	cl := SQSClient(endpoint)
	ctx := context.Background()
	queue = prefix + randomSuffix()
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

// KafkaTopics returns a Kafka broker list on which the topics exist, each
// with partitions partitions, and each topic's "<topic>.dlq" with one: on
// IDEMQ_KAFKA_URL's brokers when it is set (the topics are created there
// and deleted when the test ends; unreachable skips, or fails with
// IDEMQ_REQUIRE_SERVICES=1), else on a fresh kfake (StartKfake) that, like
// a Kafka broker's defaults, creates no topic on first use.
func KafkaTopics(t testing.TB, partitions int, topics ...string) string {
	t.Helper()
	var specs []string
	for _, name := range topics {
		specs = append(specs, name+":"+strconv.Itoa(partitions), name+".dlq:1")
	}
	raw := os.Getenv(KafkaEnv)
	if raw == "" {
		return StartKfake(t, "-brokers", "1", "-auto-create=false", "-topics", strings.Join(specs, ","))
	}
	hosts := raw
	if u, err := url.Parse(raw); err == nil && u.Scheme == "kafka" {
		hosts = u.Host
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := kafkaAdmin(t, hosts)
	if _, err := adm.BrokerMetadata(ctx); err != nil {
		Unavailable(t, "service unreachable at %s: %v", KafkaEnv, err)
	}
	var names []string
	for _, spec := range specs {
		name, n, _ := strings.Cut(spec, ":")
		parts, _ := strconv.Atoi(n)
		if _, err := adm.CreateTopic(ctx, int32(parts), 1, nil, name); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			t.Fatalf("create topic %s: %v", name, err)
		}
		names = append(names, name)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		adm.DeleteTopics(ctx, names...)
	})
	return hosts
}

// kafkaAdmin is an admin client of the Kafka brokers (a comma-separated
// list), closed when the test ends.
func kafkaAdmin(t testing.TB, brokers string) *kadm.Client {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// SetTopicConfig sets a topic's config entry name to value on the Kafka
// brokers (a comma-separated list), as an operator's kafka-configs would,
// leaving its other entries as they are.
func SetTopicConfig(t testing.TB, brokers, topic, name, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kafkaAdmin(t, brokers).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: name, Value: &value}}, topic)
	for _, r := range resp {
		err = cmp.Or(err, r.Err)
	}
	if err != nil {
		t.Fatalf("setting %s of topic %s: %v", name, topic, err)
	}
}

// randomSuffix is 8 random hex digits: names of a test's own.
func randomSuffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}
