package pgoutbox

import (
	"context"
	"crypto/rand"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/brokers/kafka"
	"github.com/idemq/idemq/brokers/rabbitmq"
	"github.com/idemq/idemq/brokers/sqs"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/internal/outboxtest"
)

// poisonEnv returns newEnv for outboxtest.PoisonBroker: a fresh outbox
// table on Postgres per test.
func poisonEnv(t *testing.T) func(t *testing.T) outboxtest.Env {
	pool := newPool(t, postgresURL(t), "idemq_outbox_poison")
	return func(t *testing.T) outboxtest.Env {
		o := newOutbox(t, pool)
		return outboxtest.Env{Store: o.Store(pool), Write: txWrite(pool, o)}
	}
}

// oneRowClaims makes every claim hold one row. The poison of the
// missing-destination tests goes elsewhere than its key's other rows; in a
// claim of several rows, ok2 would be published together with the
// poison's first attempt (the relay keeps a key's order per destination),
// so only claims of one row show ok2 waiting behind the poison.
var oneRowClaims = outbox.WithBatchSize(1)

// TestPoisonRowRabbitMQ: RabbitMQ returns the poison row, published with
// the mandatory flag to a queue that does not exist (312 NO_ROUTE); the
// fix declares the queue.
func TestPoisonRowRabbitMQ(t *testing.T) {
	newEnv := poisonEnv(t)
	u := amqpURL(t)
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	declare := func(t *testing.T, name string) {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	outboxtest.PoisonBroker(t, newEnv, func(t *testing.T) outboxtest.Broker {
		queue := "idemq-outbox-poison-" + suffix()
		missing := queue + "-missing"
		servicetest.DeleteQueuesAtCleanup(t, u, queue, missing)
		declare(t, queue)
		pub, err := rabbitmq.NewPublisher(context.Background(), u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		received := map[string][]string{}
		return outboxtest.Broker{
			Publisher: pub,
			Dest:      queue,
			Poison:    outbox.Message{Destination: missing, Body: []byte("poison")},
			Rejection: "NO_ROUTE",
			Ordered:   true,
			Options:   []outbox.Option{oneRowClaims},
			Fix:       func(t *testing.T) { declare(t, missing) },
			Received: func(t *testing.T, dest string) []string {
				ch, err := conn.Channel()
				if err != nil {
					t.Fatal(err)
				}
				defer ch.Close()
				for {
					d, ok, err := ch.Get(dest, true)
					if err != nil {
						t.Fatalf("basic.get from %s: %v", dest, err)
					}
					if !ok {
						return received[dest]
					}
					received[dest] = append(received[dest], d.MessageId)
				}
			},
		}
	})
}

// TestPoisonRowKafka: Kafka refuses the poison row, larger than the
// topic's max.message.bytes (MESSAGE_TOO_LARGE); the fix raises the limit.
// The client may send a call's rows in several produce requests, of which
// the broker takes some: the publisher says which (a *driver.Partial), and
// no row the broker took is published again.
func TestPoisonRowKafka(t *testing.T) {
	newEnv := poisonEnv(t)
	outboxtest.PoisonBroker(t, newEnv, func(t *testing.T) outboxtest.Broker {
		topic := "idemq-outbox-poison-" + suffix()
		addr := servicetest.KafkaTopics(t, 1, topic)
		setLimit := func(t *testing.T, n int) {
			servicetest.SetTopicConfig(t, addr, topic, "max.message.bytes", strconv.Itoa(n))
		}
		setLimit(t, 4096)
		pub, err := kafka.NewPublisher(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		return outboxtest.Broker{
			Publisher: pub,
			Dest:      topic,
			// Random: franz-go compresses batches, and a repeated byte
			// would fit in the limit once compressed.
			Poison:    outbox.Message{Body: randomBody(8192)},
			Rejection: "MESSAGE_TOO_LARGE",
			Ordered:   true,
			Fix:       func(t *testing.T) { setLimit(t, 1<<20) },
			Received: func(t *testing.T, dest string) []string {
				return kafkaIDs(t, strings.Split(addr, ",")[0], dest)
			},
		}
	})
}

// randomBody returns n bytes that do not compress.
func randomBody(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// kafkaIDs reads the ids of every record of partition 0 of topic, up to
// its high watermark.
func kafkaIDs(t *testing.T, addr, topic string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup(topic, 0)
	var ids []string
	for int64(len(ids)) < end.Offset {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading %s at offset %d of %d: %v", topic, len(ids), end.Offset, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			id := ""
			for _, h := range r.Headers {
				if h.Key == kafka.DefaultIDHeader {
					id = string(h.Value)
				}
			}
			ids = append(ids, id)
		})
	}
	return ids
}

// TestPoisonRowSQS: SQS refuses the poison row, sent to a queue that does
// not exist (QueueDoesNotExist); the fix creates the queue.
func TestPoisonRowSQS(t *testing.T) {
	newEnv := poisonEnv(t)
	endpoint := servicetest.SQSEndpoint(t)
	cl := servicetest.SQSClient(endpoint)
	outboxtest.PoisonBroker(t, newEnv, func(t *testing.T) outboxtest.Broker {
		ctx := context.Background()
		queue, _ := servicetest.SQSQueues(t, endpoint, "idemq-outbox-poison-")
		missing := queue + "-missing"
		return sqsBroker(t, endpoint, cl, queue, outboxtest.Broker{
			Poison:    outbox.Message{Destination: missing, Body: []byte("poison")},
			Rejection: "does not exist",
			Options:   []outbox.Option{oneRowClaims},
			Fix: func(t *testing.T) {
				out, err := cl.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(missing)})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cl.DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: out.QueueUrl}) })
			},
		})
	})
}

// sqsBroker completes b, a poison case on queue: a publisher opened by URL
// as a service would, and what each queue received, drained as it goes.
func sqsBroker(t *testing.T, endpoint string, cl *awssqs.Client, queue string, b outboxtest.Broker) outboxtest.Broker {
	pub, err := core.OpenPublisher(context.Background(), "sqs://test:test@"+queue+"?"+url.Values{"endpoint": {endpoint}, "region": {"us-east-1"}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	received := map[string][]string{}
	b.Publisher, b.Dest = pub.Driver(), queue
	b.Received = func(t *testing.T, dest string) []string {
		received[dest] = append(received[dest], sqsDrain(t, cl, dest)...)
		return received[dest]
	}
	return b
}

// sqsDrain receives and deletes every message in queue and returns their
// ids.
func sqsDrain(t *testing.T, cl *awssqs.Client, queue string) []string {
	t.Helper()
	ctx := context.Background()
	u, err := cl.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(queue)})
	if err != nil {
		t.Fatal(err)
	}
	attrs, err := cl.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: u.QueueUrl,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages}})
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(attrs.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessages)])
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for deadline := time.Now().Add(30 * time.Second); len(ids) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("received %d of the %d messages in %s", len(ids), n, queue)
		}
		out, err := cl.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: u.QueueUrl, MaxNumberOfMessages: 10,
			WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			ids = append(ids, aws.ToString(m.MessageAttributes[sqs.DefaultIDAttribute].StringValue))
			if _, err := cl.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: u.QueueUrl, ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ids
}

// TestPoisonRowSQSTooLarge: the poison row is over the queue's
// MaximumMessageSize; the fix raises the limit. The rows of a claim go in
// one publish call, which the publisher refuses before sending any of
// them (SendMessageBatch would take the others and refuse the poison
// alone, and the relay would publish them again).
func TestPoisonRowSQSTooLarge(t *testing.T) {
	newEnv := poisonEnv(t)
	endpoint := servicetest.SQSEndpoint(t)
	cl := servicetest.SQSClient(endpoint)
	outboxtest.PoisonBroker(t, newEnv, func(t *testing.T) outboxtest.Broker {
		ctx := context.Background()
		queue, _ := servicetest.SQSQueues(t, endpoint, "idemq-outbox-poison-")
		u, err := cl.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(queue)})
		if err != nil {
			t.Fatal(err)
		}
		setLimit := func(t *testing.T, n int) {
			if _, err := cl.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: u.QueueUrl,
				Attributes: map[string]string{"MaximumMessageSize": strconv.Itoa(n)}}); err != nil {
				t.Fatal(err)
			}
		}
		setLimit(t, 1024)
		return sqsBroker(t, endpoint, cl, queue, outboxtest.Broker{
			Poison:    outbox.Message{Body: []byte(strings.Repeat("p", 2048))},
			Rejection: "MaximumMessageSize",
			Fix:       func(t *testing.T) { setLimit(t, 1<<20) },
		})
	})
}
