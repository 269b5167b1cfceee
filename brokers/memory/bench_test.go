package memory_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/brokers/memory"
)

// BenchmarkPublishReceiveAck measures the broker alone: one op is one
// message published (in batches of 100), received and acknowledged, one
// per Receive and Ack or up to 100 per call, by one or four subscriptions.
func BenchmarkPublishReceiveAck(b *testing.B) {
	for _, bc := range []struct {
		name  string
		subs  int
		batch int
	}{
		{"subs=1/ack=1", 1, 1},
		{"subs=1/ack=100", 1, 100},
		{"subs=4/ack=1", 4, 1},
		{"subs=4/ack=100", 4, 100},
	} {
		b.Run(bc.name, func(b *testing.B) {
			br, err := memory.NewBroker()
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			ctx := context.Background()
			msgs := make([]*driver.Message, 100)
			for i := range msgs {
				msgs[i] = &driver.Message{ID: "id-" + strconv.Itoa(i), Body: make([]byte, 128)}
			}
			per := b.N / bc.subs
			var wg sync.WaitGroup
			b.ResetTimer()
			for range bc.subs {
				s, err := br.Subscribe("bench")
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					for left := per; left > 0; {
						ms, err := s.Receive(ctx, min(bc.batch, left))
						if err != nil {
							b.Error(err)
							return
						}
						if err := s.Ack(ctx, ms); err != nil {
							b.Error(err)
							return
						}
						left -= len(ms)
					}
				})
			}
			for sent := 0; sent < per*bc.subs; sent += len(msgs) {
				n := min(len(msgs), per*bc.subs-sent)
				if err := br.Publish(ctx, "bench", msgs[:n]...); err != nil {
					b.Fatal(err)
				}
			}
			wg.Wait()
			if err := br.WaitIdle(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
		})
	}
}
