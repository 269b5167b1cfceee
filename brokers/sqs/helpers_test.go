package sqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/internal/servicetest"
)

// The tests run against a real SQS-protocol endpoint: IDEMQ_SQS_URL when
// set, else the fauxqs emulator, which the first test that needs it starts
// from internal/fauxqs (installed there by `npm ci`) on a free loopback
// port, and TestMain stops. The emulator also stops by itself when this
// test binary dies, because it exits when its standard input closes.

const emulatorDir = "internal/fauxqs"

var emulator struct {
	once sync.Once
	url  string
	err  error
	fx   *servicetest.Fauxqs
}

func TestMain(m *testing.M) {
	code := m.Run()
	stopEmulator()
	os.Exit(code)
}

// sqsEndpoint returns the SQS endpoint. When there is none, the test is
// skipped, or fails with IDEMQ_REQUIRE_SERVICES=1.
func sqsEndpoint(t testing.TB) string {
	t.Helper()
	emulator.once.Do(func() {
		if u := os.Getenv("IDEMQ_SQS_URL"); u != "" {
			emulator.url = u
		} else {
			emulator.url, emulator.err = startEmulator()
		}
		if emulator.err == nil {
			emulator.err = ping(emulator.url)
		}
	})
	if emulator.err != nil {
		servicetest.Unavailable(t, "no SQS endpoint (set IDEMQ_SQS_URL, or run `npm ci` in brokers/sqs/%s so the tests start fauxqs): %v", emulatorDir, emulator.err)
	}
	return emulator.url
}

// startEmulator runs fauxqs from emulatorDir and returns its URL.
func startEmulator() (string, error) {
	fx, err := servicetest.StartFauxqs(emulatorDir)
	if err != nil {
		return "", err
	}
	emulator.fx = fx
	return fx.URL, nil
}

// stopEmulator stops the fauxqs startEmulator started, if any.
func stopEmulator() {
	if emulator.fx != nil {
		emulator.fx.Stop()
		emulator.fx = nil
	}
}

// ping checks the endpoint answers SQS calls.
func ping(endpoint string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := testClient(endpoint).ListQueues(ctx, &awssqs.ListQueuesInput{})
	if err != nil {
		return fmt.Errorf("SQS endpoint %s: %w", endpoint, err)
	}
	return nil
}

// clientOpts are the options that point the adapter at the test endpoint.
func clientOpts(endpoint string) []Option {
	return []Option{WithEndpoint(endpoint), WithRegion("us-east-1"), WithStaticCredentials("test", "test", "")}
}

// publisherOpts are clientOpts for a Publisher.
func publisherOpts(endpoint string) []PublisherOption {
	return []PublisherOption{WithEndpoint(endpoint), WithRegion("us-east-1"), WithStaticCredentials("test", "test", "")}
}

func testClient(endpoint string) *awssqs.Client {
	cl, err := newClient(context.Background(), clientConfig{
		endpoint: endpoint, region: "us-east-1", credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
	if err != nil {
		panic(err)
	}
	return cl
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// testQueue is a fresh queue, deleted when the test ends.
type testQueue struct {
	name, url, arn string
}

// addr is the queue's address for Open, NewPublisher and OpenDeadLetters.
func (q testQueue) addr() string { return "sqs://" + q.name }

// newQueue creates a queue named idemq-<random>[suffix] with attrs and
// registers its deletion.
func newQueue(t testing.TB, endpoint, suffix string, attrs map[string]string) testQueue {
	t.Helper()
	cl := testClient(endpoint)
	name := "idemq-" + randomHex(6) + suffix
	ctx := context.Background()
	out, err := cl.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("create queue %s: %v", name, err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() { cl.DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: aws.String(url)}) })
	a, err := cl.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	return testQueue{name: name, url: url, arn: a.Attributes["QueueArn"]}
}

// newQueueWithDLQ creates a dead-letter queue and a queue that redrives to
// it after maxReceives receives (0: no redrive policy).
func newQueueWithDLQ(t testing.TB, endpoint string, fifo bool, visibility, maxReceives int) (q, dlq testQueue) {
	t.Helper()
	suffix := ""
	attrs := map[string]string{}
	if fifo {
		suffix = ".fifo"
		attrs["FifoQueue"] = "true"
	}
	dlq = newQueue(t, endpoint, "-dlq"+suffix, attrs)
	qa := map[string]string{"VisibilityTimeout": fmt.Sprint(visibility)}
	for k, v := range attrs {
		qa[k] = v
	}
	if maxReceives > 0 {
		qa["RedrivePolicy"] = fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":%d}`, dlq.arn, maxReceives)
	}
	q = newQueue(t, endpoint, suffix, qa)
	return q, dlq
}

// drain receives and deletes every message in queue, waiting out the
// messages a lost receive answer hid (see below).
func drain(t testing.TB, endpoint, url string) []types.Message {
	t.Helper()
	cl := testClient(endpoint)
	ctx := context.Background()
	// fauxqs at times loses a receive's answer after its 200, and the SDK
	// sends the receive again: the lost answer's messages stay hidden for
	// the receive's visibility. So the drain receives with a short one,
	// and while the queue hides messages it keeps receiving until those
	// of a lost answer are visible again.
	const visibility = 2 * time.Second
	var all []types.Message
	var hiddenSince time.Time
	for {
		out, err := cl.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 0,
			VisibilityTimeout:           int32(visibility / time.Second),
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			t.Fatalf("drain %s: %v", url, err)
		}
		if len(out.Messages) == 0 {
			if _, hidden := queueCounts(t, endpoint, url); hidden == 0 {
				return all
			}
			if hiddenSince.IsZero() {
				hiddenSince = time.Now()
			}
			if time.Since(hiddenSince) > visibility+time.Second {
				return all // hidden by another receiver, not by this drain
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		hiddenSince = time.Time{}
		for _, m := range out.Messages {
			if _, err := cl.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatalf("drain delete: %v", err)
			}
		}
		all = append(all, out.Messages...)
	}
}

// queueCounts returns the visible and in-flight message counts of a queue.
func queueCounts(t testing.TB, endpoint, url string) (visible, inflight int) {
	t.Helper()
	a, err := testClient(endpoint).GetQueueAttributes(context.Background(), &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Sscan(a.Attributes["ApproximateNumberOfMessages"], &visible)
	fmt.Sscan(a.Attributes["ApproximateNumberOfMessagesNotVisible"], &inflight)
	return visible, inflight
}

func attr(m types.Message, name string) string {
	if v, ok := m.MessageAttributes[name]; ok {
		return aws.ToString(v.StringValue)
	}
	return ""
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// postgresURL returns the Postgres URL from IDEMQ_POSTGRES_URL (default the
// local server); unreachable skips, or fails with IDEMQ_REQUIRE_SERVICES=1.
func postgresURL(t testing.TB) string {
	t.Helper()
	return servicetest.PostgresURL(t)
}
