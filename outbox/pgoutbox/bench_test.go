package pgoutbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/brokers/rabbitmq"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/outbox"
)

// BenchmarkRelay measures how fast one or two relays drain a backlog of
// 10,000 rows (written beforehand, untimed) into the memory broker or
// RabbitMQ with publisher confirms, with rows without an ordering key and
// with 100 keys. It reports msgs/s.
func BenchmarkRelay(b *testing.B) {
	url := postgresURL(b)
	const rows = 10000
	for _, broker := range []string{"memory", "rabbitmq"} {
		for _, keys := range []int{0, 100} {
			for _, relays := range []int{1, 2} {
				b.Run(fmt.Sprintf("broker=%s/keys=%d/relays=%d", broker, keys, relays), func(b *testing.B) {
					benchRelay(b, url, broker, rows, keys, relays)
				})
			}
		}
	}
}

func benchRelay(b *testing.B, url, broker string, rows, keys, relays int) {
	ctx := context.Background()
	pool := newPool(b, url, "pgoutbox-bench")
	o := newOutbox(b, pool, WithNotify(false))
	dest := "bench-" + suffix()
	pubs := make([]driver.Publisher, relays)
	switch broker {
	case "memory":
		mb, _ := memory.NewBroker()
		defer mb.Close()
		for i := range pubs {
			pubs[i] = mb
		}
	case "rabbitmq":
		au := amqpURL(b)
		declareQueue(b, au, dest)
		for i := range pubs {
			p, err := rabbitmq.NewPublisher(ctx, au)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			pubs[i] = p
		}
	}
	body := make([]byte, 200)
	var total int
	var elapsed time.Duration
	for b.Loop() {
		b.StopTimer()
		for start := 0; start < rows; start += 1000 {
			msgs := make([]*outbox.Message, 0, 1000)
			for i := start; i < start+1000; i++ {
				m := &outbox.Message{Destination: dest, Body: body}
				if keys > 0 {
					m.Key = fmt.Sprint("k", i%keys)
				}
				msgs = append(msgs, m)
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return o.Write(ctx, tx, msgs...) }); err != nil {
				b.Fatal(err)
			}
		}
		pool.Exec(ctx, "VACUUM ANALYZE "+o.ident)
		b.StartTimer()
		t0 := time.Now()
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i := range relays {
			r, err := o.NewRelay(pool, pubs[i], outbox.WithRetention(0), outbox.WithPollInterval(10*time.Millisecond), outbox.WithLogger(discard()))
			if err != nil {
				b.Fatal(err)
			}
			wg.Add(1)
			go func() { defer wg.Done(); r.Run(runCtx) }()
		}
		waitPending(b, o.Store(pool), 0)
		cancel()
		wg.Wait()
		elapsed += time.Since(t0)
		total += rows
		if broker == "rabbitmq" {
			b.StopTimer()
			purge(b, amqpURL(b), dest)
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(total)/elapsed.Seconds(), "msgs/s")
}
