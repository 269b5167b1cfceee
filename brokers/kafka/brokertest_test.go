package kafka

import (
	"context"
	"testing"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
)

// harness runs the conformance suite with the given Source options; every
// fixture gets its own kfake cluster (or topic on IDEMQ_KAFKA_URL), topic
// of four partitions and group.
func harness(retryTopic bool, opts ...Option) brokertest.Harness {
	return brokertest.Harness{
		RecordsCause: true,
		Open: func(t *testing.T) *brokertest.Fixture {
			bs := brokers(t)
			topic := newTopic(t, bs, 4)
			if retryTopic {
				createTopics(t, bs, 2, topic+".retry")
				opts = append(opts, WithRetryTopic(topic+".retry"))
			}
			group := "idemq-test-" + randomHex(4)
			pub, err := NewPublisher(bs)
			if err != nil {
				t.Fatalf("NewPublisher: %v", err)
			}
			t.Cleanup(func() { pub.Close() })
			return &brokertest.Fixture{
				Publish: func(ctx context.Context, msgs ...*core.Message) error {
					return pub.Publish(ctx, topic, msgs...)
				},
				NewSource: func(t *testing.T) core.Source {
					all := append(fastGroup(t), WithTopic(topic), WithGroup(group))
					s, err := Open(context.Background(), bs, append(all, opts...)...)
					if err != nil {
						t.Fatalf("Open: %v", err)
					}
					return s
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					var out []brokertest.DeadLetter
					for _, r := range readAll(t, bs, topic+".dlq", 1) {
						out = append(out, brokertest.DeadLetter{ID: r.headers[DefaultIDHeader], Body: r.value, Cause: r.headers[HeaderCause]})
					}
					return out, nil
				},
			}
		},
	}
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, harness(false))
}

// The suite again with retries through a retry topic and no ordering.
// (OrderPerPartition cannot run the suite: its cases hold more unsettled
// deliveries than the topic has partitions.)
func TestConformanceRetryTopic(t *testing.T) {
	brokertest.Run(t, harness(true, WithOrdering(OrderNone)))
}
