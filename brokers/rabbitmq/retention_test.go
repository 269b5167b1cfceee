package rabbitmq

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
)

// A RabbitMQ queue keeps messages until they are consumed: against a store
// that prunes claims, the Consumer warns, or refuses to start when strict.
func TestRetentionAgainstUnboundedHorizon(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	brokertest.RetentionAgainstHorizon(t, func(t *testing.T) core.Source {
		s, err := Open(context.Background(), url, q)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}, 48*time.Hour, "unbounded")
}
