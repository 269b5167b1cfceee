package rabbitmq

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
)

// A RabbitMQ queue keeps messages until they are consumed: against a store
// that prunes claims, the Consumer warns, or refuses to start when strict.
func TestRetentionAgainstUnboundedHorizon(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	brokertest.RetentionAgainstHorizon(t, func(t *testing.T) driver.Source {
		s, err := Open(context.Background(), url, q)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}, 48*time.Hour, "unbounded")
}

// With WithMessageTTL the horizon is bounded: a message waits at most the
// TTL in the queue and the TTL again in its dead-letter queue.
func TestRetentionAgainstMessageTTL(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	brokertest.RetentionAgainstHorizon(t, func(t *testing.T) driver.Source {
		s, err := OpenURL(context.Background(), url+"?queue="+q+"&queue_type=quorum&message_ttl=1h")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}, time.Hour, "2h0m0s")
	s, err := Open(context.Background(), url, q, WithQueueType(Quorum), WithMessageTTL(time.Hour), WithDeclare(false))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if h, ok := s.RedeliveryHorizon(context.Background()); !ok || h != driver.Unbounded {
		t.Errorf("without declaring, the TTL is the broker's to apply: horizon %v, %v; want unbounded", h, ok)
	}
}

// A message nobody consumes within the TTL moves to the dead-letter queue
// (where it stays the TTL again).
func TestMessageTTLMovesToDeadLetterQueue(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	s, err := OpenURL(context.Background(), url+"?queue="+q+"&message_ttl=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	publishN(t, url, q, "ttl", 3)
	waitUntil(t, 30*time.Second, func() bool { return queueDepth(t, url, q) == 0 && queueDepth(t, url, q+".dlq") == 3 })
	if _, err := OpenURL(context.Background(), url+"?queue="+q+"&message_ttl=soon"); err == nil || !strings.Contains(err.Error(), "message_ttl") {
		t.Errorf("a bad message_ttl: %v", err)
	}
}
