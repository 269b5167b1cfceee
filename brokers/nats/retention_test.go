package nats

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// The streams the adapter declares keep messages without an age limit:
// against a store that prunes claims, the Consumer warns, or refuses to
// start when strict.
func TestRetentionAgainstUnboundedHorizon(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	brokertest.RetentionAgainstHorizon(t, func(t *testing.T) driver.Source {
		return openSource(t, ts)
	}, 48*time.Hour, "unbounded")
}

// With a MaxAge on the stream and on the dead-letter stream the horizon
// is bounded: a message waits at most the stream's MaxAge unconsumed and
// the dead-letter stream's once parked (a redrive publishes it again).
// A dead-letter stream without MaxAge leaves the horizon unbounded.
func TestRetentionAgainstMaxAge(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	ctx := ctxFor(t, time.Minute)
	declare := func(name, subject string, maxAge time.Duration) {
		t.Helper()
		if _, err := ts.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage, MaxAge: maxAge,
		}); err != nil {
			t.Fatalf("declaring %s: %v", name, err)
		}
	}
	declare(ts.name, ts.subject, time.Hour)
	declare(ts.name+"_DLQ", "idemq.dlq."+ts.name+".worker", 2*time.Hour)
	brokertest.RetentionAgainstHorizon(t, func(t *testing.T) driver.Source {
		return openSource(t, ts)
	}, 150*time.Minute, "3h0m0s")

	declare(ts.name+"_DLQ", "idemq.dlq."+ts.name+".worker", 0)
	s := openSource(t, ts)
	if h, ok := s.RedeliveryHorizon(ctx); !ok || h != driver.Unbounded {
		t.Errorf("a dead-letter stream without MaxAge: horizon %v, %v; want unbounded", h, ok)
	}
}
