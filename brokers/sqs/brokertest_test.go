package sqs

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
)

// harness runs the conformance suite with the given Source options; every
// fixture gets its own queue and dead-letter queue. The queue's visibility
// timeout is 5s, so a message that is not released or settled would not
// come back within the suite's receive timeout by accident.
func harness(redrive bool, opts ...Option) brokertest.Harness {
	return brokertest.Harness{
		RecordsCause: !redrive,
		Open: func(t *testing.T) *brokertest.Fixture {
			ep := sqsEndpoint(t)
			maxReceives := 0
			if redrive {
				// DeadLetterRedrive parks a message once its receive count
				// passes 1: the dead-lettered message is received once more
				// by SQS's redrive and moved.
				maxReceives = 1
			}
			q, dlq := newQueueWithDLQ(t, ep, false, 5, maxReceives)
			all := append(clientOpts(ep), WithLogger(testLogger(t)), WithWaitTime(time.Second))
			if !redrive {
				all = append(all, WithDeadLetterQueue(dlq.name))
			}
			all = append(all, opts...)
			pub, err := NewPublisher(context.Background(), q.url, clientOpts(ep)...)
			if err != nil {
				t.Fatalf("NewPublisher: %v", err)
			}
			t.Cleanup(func() { pub.Close() })
			return &brokertest.Fixture{
				Publish: func(ctx context.Context, msgs ...*core.Message) error { return pub.Publish(ctx, "", msgs...) },
				NewSource: func(t *testing.T) core.Source {
					s, err := Open(context.Background(), q.url, all...)
					if err != nil {
						t.Fatalf("Open: %v", err)
					}
					return s
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					var out []brokertest.DeadLetter
					for _, m := range drain(t, ep, dlq.url) {
						out = append(out, brokertest.DeadLetter{
							ID:    attr(m, DefaultIDAttribute),
							Body:  []byte(*m.Body),
							Cause: attr(m, AttributeCause),
						})
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
