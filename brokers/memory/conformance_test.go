package memory_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
)

// TestConformance runs the shared broker suite (adapter contract and the
// whole pipeline on SQLite) against the memory broker. No service is
// needed, so nothing is skipped.
func TestConformance(t *testing.T) {
	b := newBroker(t, memory.WithVisibilityTimeout(time.Minute))
	brokertest.Run(t, brokertest.Harness{
		RecordsCause: true,
		Quiet:        100 * time.Millisecond, // nothing arrives late in process
		Open: func(t *testing.T) *brokertest.Fixture {
			var r [4]byte
			_, _ = rand.Read(r[:])
			queue := "conformance-" + hex.EncodeToString(r[:])
			return &brokertest.Fixture{
				Publish: func(ctx context.Context, msgs ...*core.Message) error {
					return b.Publish(ctx, queue, msgs...)
				},
				NewSource: func(t *testing.T) core.Source {
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
