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
		s, err := Open(context.Background(), url, WithQueue(q))
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
		s, err := Open(context.Background(), url+"?queue="+q+"&queue_type=quorum&message_ttl=1h")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}, time.Hour, "2h0m0s")
	s, err := Open(context.Background(), url, WithQueue(q), WithQueueType(Quorum), WithMessageTTL(time.Hour), WithDeclare(false))
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
	s, err := Open(context.Background(), url+"?queue="+q+"&message_ttl=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	publishN(t, url, q, "ttl", 3)
	waitUntil(t, 30*time.Second, func() bool { return queueDepth(t, url, q) == 0 && queueDepth(t, url, q+".dlq") == 3 })
	if _, err := Open(context.Background(), url+"?queue="+q+"&message_ttl=soon"); err == nil || !strings.Contains(err.Error(), "message_ttl") {
		t.Errorf("a bad message_ttl: %v", err)
	}
}

// An existing queue keeps its arguments: declaring it again with a TTL
// fails, and the error says why and what to do; a policy's TTL, which a
// client cannot read, bounds the horizon once the URL states it.
func TestExistingQueueTTL(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	s, err := Open(context.Background(), url+"?queue="+q)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, err = Open(context.Background(), url+"?queue="+q+"&message_ttl=1h")
	if err == nil || !strings.Contains(err.Error(), "PRECONDITION_FAILED") || !strings.Contains(err.Error(), "exists with other arguments") || !strings.Contains(err.Error(), "policy_ttl=") {
		t.Fatalf("declaring an existing queue with message_ttl: %v, want PRECONDITION_FAILED with the hint", err)
	}
	s, err = Open(context.Background(), url+"?queue="+q+"&policy_ttl=36h")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if h, ok := s.RedeliveryHorizon(context.Background()); !ok || h != 72*time.Hour {
		t.Errorf("policy_ttl=36h: horizon %v, %v; want 72h", h, ok)
	}
	hint := s.HorizonHint(48 * time.Hour)
	for _, want := range []string{"rabbitmqctl set_policy idemq-ttl '^(" + q + "|" + q + "\\.dlq)$'", `{"message-ttl":86400000}`, "policy_ttl=24h0m0s", "message_ttl=24h0m0s"} {
		if !strings.Contains(hint, want) {
			t.Errorf("hint %q lacks %q", hint, want)
		}
	}
	if _, err := Open(context.Background(), url+"?queue="+q+"&policy_ttl=soon"); err == nil || !strings.Contains(err.Error(), "policy_ttl") {
		t.Errorf("a bad policy_ttl: %v", err)
	}
}
