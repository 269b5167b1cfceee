package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// The horizon of a Kafka topic is its retention.ms (here 2h): against a
// store that keeps claims for 1h, the Consumer warns, or refuses to start
// when strict.
func TestRetentionAgainstTopicRetention(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	servicetest.SetTopicConfig(t, bs, topic, "retention.ms", "7200000")
	brokertest.RetentionAgainstHorizon(t, func(t *testing.T) driver.Source {
		s, err := Open(context.Background(), "kafka://"+bs+"/"+topic+"?group=retention-"+randomHex(3), fastGroup(t)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}, time.Hour, "2h0m0s")
}
