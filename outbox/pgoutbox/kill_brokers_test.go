package pgoutbox

import (
	"context"
	"net/url"
	"os"
	"testing"

	_ "github.com/idemq/idemq/brokers/kafka" // kafka:// for the relay child
	_ "github.com/idemq/idemq/brokers/sqs"   // sqs:// for the relay child
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

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
	base := "kafka://" + servicetest.KafkaTopics(t, 3, topic) + "/" + topic
	group := "kill-" + suffix()
	runRelayKill(t, relayKill{dest: topic, broker: base, ordered: true, source: func(ctx context.Context) (driver.Source, error) {
		return core.OpenSource(ctx, base+"?group="+group+"&session_timeout=6s&heartbeat_interval=1s")
	}})
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
	endpoint := servicetest.SQSEndpoint(t)
	queue, dlq := servicetest.SQSQueues(t, endpoint, "idemq-outbox-kill-")
	client := url.Values{"endpoint": {endpoint}, "region": {"us-east-1"}}
	pubURL := "sqs://test:test@" + queue + "?" + client.Encode()
	client.Set("dlq", dlq)
	client.Set("wait", "1s")
	srcURL := "sqs://test:test@" + queue + "?" + client.Encode()
	runRelayKill(t, relayKill{dest: queue, broker: pubURL, source: func(ctx context.Context) (driver.Source, error) {
		return core.OpenSource(ctx, srcURL)
	}})
}
