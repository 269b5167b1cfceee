package sqs

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
)

// The horizon of an SQS queue is the longer of its and its dead-letter
// queue's message retention (here 2h and 3h): against a store that keeps
// claims for 1h, the Consumer warns, or refuses to start when strict.
func TestRetentionAgainstQueueRetention(t *testing.T) {
	ep := sqsEndpoint(t)
	dlq := newQueue(t, ep, "-dlq", map[string]string{"MessageRetentionPeriod": "10800"})
	q := newQueue(t, ep, "", map[string]string{"MessageRetentionPeriod": "7200"})
	brokertest.RetentionAgainstHorizon(t, func(t *testing.T) driver.Source {
		s, err := Open(context.Background(), q.addr(), append(clientOpts(ep), WithDeadLetterQueue(dlq.name), WithWaitTime(time.Second))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}, time.Hour, "3h0m0s")
}
