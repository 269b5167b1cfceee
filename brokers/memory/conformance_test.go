package memory_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core/driver"
)

// TestConformance runs the shared broker suite (adapter contract and the
// whole pipeline on SQLite) against the memory broker. No service is
// needed, so nothing is skipped.
func TestConformance(t *testing.T) {
	// A named broker, so that mem:// URLs reach it too.
	b, err := memory.Named("conformance", memory.WithVisibilityTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	brokertest.Run(t, brokertest.Harness{
		RecordsCause: true,
		CarriesKey:   true,
		Quiet:        100 * time.Millisecond, // nothing arrives late in process
		Open: func(t *testing.T) *brokertest.Fixture {
			var r [4]byte
			_, _ = rand.Read(r[:])
			queue := "conformance-" + hex.EncodeToString(r[:])
			url := "mem://" + queue + "?broker=conformance"
			return &brokertest.Fixture{
				SourceURL:    url,
				PublisherURL: url,
				NewPublisher: func(t *testing.T) driver.Publisher { return b.Publisher(queue) },
				Reconnect:    func(t *testing.T, src driver.Source) { src.(*memory.Subscription).ExpireLeases() },
				Raw: func(ctx context.Context) (brokertest.RawMessage, error) {
					// The broker is its own client: a plain subscription.
					s, err := b.Subscribe(queue)
					if err != nil {
						return brokertest.RawMessage{}, err
					}
					defer s.Close()
					ms, err := s.Receive(ctx, 1)
					if err != nil {
						return brokertest.RawMessage{}, err
					}
					m := ms[0]
					return brokertest.RawMessage{ID: m.ID, Key: m.Key, Headers: m.Headers, Body: m.Body}, s.Ack(ctx, ms)
				},
				Publish: func(ctx context.Context, msgs ...*driver.Message) error {
					return b.Publish(ctx, queue, msgs...)
				},
				NewSource: func(t *testing.T) driver.Source {
					s, err := b.Subscribe(queue)
					if err != nil {
						t.Fatalf("Subscribe: %v", err)
					}
					return s
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					var out []brokertest.DeadLetter
					for _, dl := range b.DeadLetters(queue) {
						out = append(out, brokertest.DeadLetter{ID: dl.Message.ID, Body: dl.Message.Body, Cause: dl.Cause.Error()})
					}
					return out, nil
				},
			}
		},
	})
}
