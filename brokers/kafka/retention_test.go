package kafka

import (
	"context"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
)

// The horizon of a Kafka topic is its retention.ms (here 2h): against a
// store that keeps claims for 1h, the Consumer warns, or refuses to start
// when strict.
func TestRetentionAgainstTopicRetention(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := adminClient(bs).IncrementalAlterConfigs(ctx, &kafkago.IncrementalAlterConfigsRequest{
		Resources: []kafkago.IncrementalAlterConfigsRequestResource{{
			ResourceType: kafkago.ResourceTypeTopic, ResourceName: topic,
			Configs: []kafkago.IncrementalAlterConfigsRequestConfig{{
				Name: "retention.ms", Value: "7200000", ConfigOperation: kafkago.ConfigOperationSet,
			}},
		}},
	})
	if err != nil {
		t.Fatalf("setting retention.ms: %v", err)
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			t.Fatalf("setting retention.ms: %v", r.Error)
		}
	}
	brokertest.RetentionAgainstHorizon(t, func(t *testing.T) core.Source {
		s, err := Open(context.Background(), "kafka://"+bs+"/"+topic+"?group=retention-"+randomHex(3), fastGroup(t)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}, time.Hour, "2h0m0s")
}
