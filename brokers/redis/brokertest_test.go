package redis

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
)

// harness runs the conformance suite on a fresh stream per fixture, with
// a min_idle of 1s: a lease that lapses does so well within the suite's
// receive timeout, and the Consumer's heartbeat (every 0.27s) keeps the
// others. Each
// source has a consumer name of its own, as sources that run at once
// must: a source reads back, when it starts, what its name holds.
func harness() brokertest.Harness {
	var sources atomic.Int64
	return brokertest.Harness{
		RecordsCause:        true,
		CarriesKey:          true,
		OperatesDeadLetters: true,
		Open: func(t *testing.T) *brokertest.Fixture {
			ts := newTestStream(t, RedisURL(t))
			// The group exists before anything is published or taken raw.
			ts.open(t).Close()
			return &brokertest.Fixture{
				Publish: ts.publishRaw,
				NewSource: func(t *testing.T) driver.Source {
					return ts.open(t, WithConsumer(fmt.Sprintf("worker-%d", sources.Add(1))))
				},
				DeadLetters: ts.rawDeadLetters,
				Reconnect:   lapseLeases,
				NewPublisher: func(t *testing.T) driver.Publisher {
					p, err := NewPublisher(context.Background(), ts.url(""))
					if err != nil {
						t.Fatalf("NewPublisher: %v", err)
					}
					return p
				},
				Raw:          ts.rawNext,
				SourceURL:    ts.url("group=g&consumer=worker&min_idle=1s&poll=50ms"),
				PublisherURL: ts.url(""),
			}
		},
	}
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, harness())
}
