package rabbitmq

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
)

// harness runs the conformance suite on RabbitMQ with the given Source
// options; every fixture gets its own queues.
func harness(recordsCause bool, opts ...Option) brokertest.Harness {
	return brokertest.Harness{
		RecordsCause: recordsCause,
		Open: func(t *testing.T) *brokertest.Fixture {
			url := amqpURL(t)
			q := uniqueQueue(t, url)
			ctx := context.Background()
			all := append([]Option{WithLogger(testLogger(t)), WithReconnectBackoff(50*time.Millisecond, time.Second)}, opts...)
			// Opening a Source declares the topology the publisher needs.
			s, err := Open(ctx, url, q, all...)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			s.Close()
			pub, err := NewPublisher(ctx, url)
			if err != nil {
				t.Fatalf("NewPublisher: %v", err)
			}
			t.Cleanup(func() { pub.Close() })
			return &brokertest.Fixture{
				Publish: func(ctx context.Context, msgs ...*core.Message) error {
					return pub.Publish(ctx, q, msgs...)
				},
				NewSource: func(t *testing.T) core.Source {
					s, err := Open(ctx, url, q, all...)
					if err != nil {
						t.Fatalf("Open: %v", err)
					}
					return s
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					var out []brokertest.DeadLetter
					for _, d := range drainQueue(t, url, q+".dlq") {
						cause, _ := d.Headers[HeaderCause].(string)
						out = append(out, brokertest.DeadLetter{ID: d.MessageId, Body: d.Body, Cause: cause})
					}
					return out, nil
				},
			}
		},
	}
}

func TestConformanceClassic(t *testing.T) {
	brokertest.Run(t, harness(true))
}

func TestConformanceQuorumRetryQueueReject(t *testing.T) {
	brokertest.Run(t, harness(false, WithQueueType(Quorum), WithRetryMode(RetryViaQueue), WithDeadLetterMode(DeadLetterReject)))
}

// Quorum queues count redeliveries in x-delivery-count: this variant's
// requeues exercise that path.
func TestConformanceQuorumRequeue(t *testing.T) {
	brokertest.Run(t, harness(true, WithQueueType(Quorum)))
}
