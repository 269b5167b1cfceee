package rabbitmq

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// The end-to-end RabbitMQ → Postgres comparison (the seed-style consumer on
// raw amqp091-go + pgx against idemq at batch size 1 and in batch mode) is
// the bench module's benchmark package's (cd bench && go run
// ./cmd/idemq-bench); what stays here measures the adapter alone.

// BenchmarkSourceReceiveAck measures the adapter alone, no database:
// Receive b.N messages with a window of 400 and ack them 200 at a time
// (a multiple ack), or one by one; "raw" is plain amqp091-go
// doing the same with a multiple ack every 200, for comparison.
func BenchmarkSourceReceiveAck(b *testing.B) {
	amqpU := amqpURL(b)
	b.Run("raw-amqp091-ack200", func(b *testing.B) {
		ctx := context.Background()
		q := uniqueQueue(b, amqpU)
		s, err := Open(ctx, amqpU, WithQueue(q))
		if err != nil {
			b.Fatal(err)
		}
		s.Close()
		publishBench(b, amqpU, q, b.N)
		ch := testChannel(b, amqpU)
		if err := ch.Qos(400, 0, false); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		start := time.Now()
		deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		for i := 1; i <= b.N; i++ {
			d := <-deliveries
			if i%200 == 0 || i == b.N {
				if err := d.Ack(true); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
	for _, batch := range []int{1, 200} {
		b.Run(fmt.Sprintf("ack%d", batch), func(b *testing.B) {
			ctx := context.Background()
			q := uniqueQueue(b, amqpU)
			src, err := Open(ctx, amqpU, WithQueue(q))
			if err != nil {
				b.Fatal(err)
			}
			defer src.Close()
			if _, err := src.Start(ctx, driver.Setup{Window: 400}); err != nil {
				b.Fatal(err)
			}
			publishBench(b, amqpU, q, b.N)
			b.ResetTimer()
			start := time.Now()
			pending := make([]*driver.Message, 0, 400)
			for received := 0; received < b.N; {
				ms, err := src.Receive(ctx, min(400-len(pending), b.N-received))
				if err != nil {
					b.Fatal(err)
				}
				received += len(ms)
				pending = append(pending, ms...)
				for len(pending) >= batch || (received == b.N && len(pending) > 0) {
					n := min(batch, len(pending))
					if err := src.Ack(ctx, pending[:n]); err != nil {
						b.Fatal(err)
					}
					pending = append(pending[:0], pending[n:]...)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

func publishBench(b *testing.B, amqpU, q string, n int) {
	msgs := make([]*driver.Message, n)
	for i := range msgs {
		msgs[i] = &driver.Message{ID: fmt.Sprintf("raw-%07d", i), Body: []byte(`{"n":1}`)}
	}
	pub, err := NewPublisher(context.Background(), amqpU)
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(context.Background(), q, msgs...); err != nil {
		b.Fatal(err)
	}
}
