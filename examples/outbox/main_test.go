package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/url"
	"strings"
	"testing"

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

// The relay publishes to the URL's topic (acks=all) and the billing
// consumer reads it in a group of its own.
func TestExampleKafka(t *testing.T) {
	topic := "idemq-example-outbox-" + unique()
	brokers := servicetest.KafkaTopics(t, 3, topic)
	runExample(t, "kafka://"+brokers+"/"+topic+"?group=billing-"+unique()+"&session_timeout=6s&heartbeat_interval=1s")
}

// The relay publishes with SendMessageBatch; the consumer long-polls the
// same queue (a short wait, so that stopping does not wait 20s).
func TestExampleSQS(t *testing.T) {
	endpoint := servicetest.SQSEndpoint(t)
	queue, dlq := servicetest.SQSQueues(t, endpoint, "idemq-example-outbox-")
	runExample(t, "sqs://test:test@"+queue+"?"+url.Values{
		"endpoint": {endpoint}, "region": {"us-east-1"}, "dlq": {dlq}, "wait": {"1s"},
	}.Encode())
}

// The relay publishes with JetStream publish acks (Nats-Msg-Id = the row's
// id); the consumer is a durable pull consumer on the stream it declares.
func TestExampleNATS(t *testing.T) {
	nu := servicetest.NATSURL(t)
	stream := "OUTBOX_" + strings.ToUpper(unique())
	servicetest.DeleteStreamsAtCleanup(t, nu, stream, stream+"_DLQ")
	runExample(t, nu+"/"+stream+"?consumer=billing&subject=orders."+unique())
}
