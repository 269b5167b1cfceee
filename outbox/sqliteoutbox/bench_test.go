package sqliteoutbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/outbox"
)

// BenchmarkRelay measures how fast one or two relays drain a backlog of
// 10,000 rows (written beforehand, untimed) into the memory broker, with
// rows without an ordering key and with 100 keys. It reports msgs/s. Two
// relays on one file take turns with SQLite's write lock: expect no gain.
func BenchmarkRelay(b *testing.B) {
	for _, keys := range []int{0, 100} {
		for _, relays := range []int{1, 2} {
			b.Run(fmt.Sprintf("keys=%d/relays=%d", keys, relays), func(b *testing.B) {
				benchRelay(b, 10000, keys, relays)
			})
		}
	}
}

func benchRelay(b *testing.B, rows, keys, relays int) {
	ctx := context.Background()
	path := tempPath(b)
	db := openDB(b, path)
	o := newOutbox(b, db)
	mb, _ := memory.NewBroker()
	defer mb.Close()
	body := make([]byte, 200)
	var total int
	var elapsed time.Duration
	for b.Loop() {
		b.StopTimer()
		for start := 0; start < rows; start += 500 {
			msgs := make([]*outbox.Message, 0, 500)
			for i := start; i < start+500; i++ {
				m := &outbox.Message{Destination: "bench", Body: body}
				if keys > 0 {
					m.Key = fmt.Sprint("k", i%keys)
				}
				msgs = append(msgs, m)
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := o.Write(ctx, tx, msgs...); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		t0 := time.Now()
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for range relays {
			r, err := o.NewRelay(openDB(b, path), mb, outbox.WithRetention(0), outbox.WithPollInterval(10*time.Millisecond), outbox.WithLogger(discard()))
			if err != nil {
				b.Fatal(err)
			}
			wg.Add(1)
			go func() { defer wg.Done(); r.Run(runCtx) }()
		}
		waitPending(b, o.Store(db))
		cancel()
		wg.Wait()
		elapsed += time.Since(t0)
		total += rows
	}
	b.ReportMetric(float64(total)/elapsed.Seconds(), "msgs/s")
}
