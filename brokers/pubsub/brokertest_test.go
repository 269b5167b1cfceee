package pubsub

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
)

// harness runs the conformance suite on a fresh subscription per fixture,
// with exactly-once delivery (the emulator reports the ack ids it no
// longer knows, so a settlement after Reconnect is stale) and a
// dead-letter policy (Attempt is Pub/Sub's delivery attempt, counted
// across consumers) that allows more deliveries than any case makes.
func harness(query string) brokertest.Harness {
	return brokertest.Harness{
		RecordsCause:        true,
		CarriesKey:          true,
		OperatesDeadLetters: true,
		ReceiveTimeout:      30 * time.Second,
		Open: func(t *testing.T) *brokertest.Fixture {
			ts := newTestSub(t, query)
			return &brokertest.Fixture{
				Publish: ts.publish,
				NewSource: func(t *testing.T) driver.Source {
					s, err := Open(context.Background(), ts.url(""))
					if err != nil {
						t.Fatalf("Open: %v", err)
					}
					return s
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					pms, err := ts.take(ctx, ts.name+"-dlq", 100, time.Second)
					var out []brokertest.DeadLetter
					for _, pm := range pms {
						out = append(out, brokertest.DeadLetter{ID: pm.Attributes["message-id"], Body: pm.Data, Cause: pm.Attributes[driver.CauseHeader]})
					}
					return out, err
				},
				Reconnect: func(t *testing.T, _ driver.Source) { ts.seek(t) },
				NewPublisher: func(t *testing.T) driver.Publisher {
					p, err := NewPublisher(context.Background(), ts.url(""))
					if err != nil {
						t.Fatalf("NewPublisher: %v", err)
					}
					return p
				},
				Raw: func(ctx context.Context) (brokertest.RawMessage, error) {
					for {
						pms, err := ts.take(ctx, ts.name, 1, 2*time.Second)
						if err != nil || len(pms) == 1 {
							if err != nil {
								return brokertest.RawMessage{}, err
							}
							pm := pms[0]
							return brokertest.RawMessage{ID: pm.Attributes["message-id"], Key: pm.OrderingKey, Headers: pm.Attributes, Body: pm.Data}, nil
						}
						if ctx.Err() != nil {
							return brokertest.RawMessage{}, ctx.Err()
						}
					}
				},
				SourceURL:    ts.url(""),
				PublisherURL: ts.url(""),
			}
		},
	}
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, harness("exactly_once=true&max_deliveries=100"))
}
