package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// The end-to-end Kafka → Postgres comparison (the seed-style consumer and
// hand-tuned batch consumers on raw franz-go and kafka-go + pgx, idemq at
// batch size 1 and in batch mode) is the bench module's benchmark
// package's (cd bench && go run ./cmd/idemq-bench --broker kafka://…);
// what stays here measures the adapter alone.

// BenchmarkSourceReceiveAck measures the adapter alone: b.N messages over
// four partitions received 100 at a time and acked in one call each, with
// commits batched by default, no database.
func BenchmarkSourceReceiveAck(b *testing.B) {
	bs := brokers(b)
	topic := newTopic(b, bs, 4)
	publishN(b, bs, topic, "rx", b.N, nil)
	s, err := Open(context.Background(), bs, WithTopic(topic), WithGroup("rx-"+randomHex(4)))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Start(ctx, driver.Setup{Window: 400}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for n := 0; n < b.N; {
		ms, err := s.Receive(ctx, min(100, b.N-n))
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Ack(ctx, ms); err != nil {
			b.Fatal(err)
		}
		n += len(ms)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}
