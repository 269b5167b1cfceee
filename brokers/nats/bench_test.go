package nats

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// The end-to-end comparisons with a database are the bench module's; this
// measures the adapter alone.

// BenchmarkSourceReceiveAck: publish b.N messages with the Publisher
// (async, every ack awaited), then receive them through the Consumer's
// flow with a window of 400 and ack them one by one (a double ack each) or
// 200 at a time with AckBatch (plain acks and a double ack).
func BenchmarkSourceReceiveAck(b *testing.B) {
	u := servicetest.NATSURL(b)
	for _, batch := range []int{1, 200} {
		b.Run(fmt.Sprintf("ack%d", batch), func(b *testing.B) {
			ctx := context.Background()
			ts := newTestStream(b, u)
			p, err := NewPublisher(ctx, u+"/"+ts.name, WithSubject(ts.subject))
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			msgs := make([]*driver.Message, b.N)
			for i := range msgs {
				msgs[i] = &driver.Message{ID: fmt.Sprintf("b-%d", i), Body: []byte(`{"n":1}`)}
			}
			start := time.Now()
			if err := p.Publish(ctx, "", msgs...); err != nil {
				b.Fatal(err)
			}
			published := float64(b.N) / time.Since(start).Seconds()
			s, err := Open(ctx, u+"/"+ts.name, WithConsumer("bench"), WithSubject(ts.subject))
			if err != nil {
				b.Fatal(err)
			}
			r := brokertest.StartReceiver(b, s, 400)
			b.ResetTimer()
			start = time.Now()
			var pending []*brokertest.Delivery
			for i := 1; i <= b.N; i++ {
				d, err := r.Receive(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if batch == 1 {
					if err := d.Ack(ctx); err != nil {
						b.Fatal(err)
					}
					continue
				}
				pending = append(pending, d)
				if len(pending) == batch || i == b.N {
					if err := r.AckBatch(ctx, pending); err != nil {
						b.Fatal(err)
					}
					pending = pending[:0]
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			b.ReportMetric(published, "published/s")
		})
	}
}
