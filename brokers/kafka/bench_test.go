package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// The end-to-end Kafka → Postgres comparison (the seed-style consumer on raw
// kafka-go + pgx, a hand-tuned batch consumer, idemq at batch size 1 and in
// batch mode) is the bench module's benchmark package's (cd bench && go run
// ./cmd/idemq-bench --broker kafka://…); what stays here measures the
// adapter alone.

// BenchmarkSourceReceiveAck measures the adapter alone: b.N messages over
// four partitions received and acked by one goroutine through AckBatch of
// 100, with commits batched by default, no database.
func BenchmarkSourceReceiveAck(b *testing.B) {
	bs := brokers(b)
	topic := newTopic(b, bs, 4)
	publishN(b, bs, topic, "rx", b.N, nil)
	s, err := Open(context.Background(), bs, WithTopic(topic), WithGroup("rx-"+randomHex(4)))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.SetWindow(400); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	batch := make([]driver.Delivery, 0, 100)
	for i := 0; i < b.N; i++ {
		d, err := s.Receive(ctx)
		if err != nil {
			b.Fatal(err)
		}
		batch = append(batch, d)
		if len(batch) == cap(batch) || i == b.N-1 {
			if err := s.AckBatch(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}
