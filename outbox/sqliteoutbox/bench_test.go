package sqliteoutbox

import (
	"fmt"
	"testing"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/internal/outboxtest"
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
	path := tempPath(b)
	db := openDB(b, path)
	o := newOutbox(b, db)
	mb, _ := memory.NewBroker()
	defer mb.Close()
	outboxtest.BenchRelay(b, rows, keys, relays, o.Store(db), outboxtest.TxWrite(db, o.Write), func(opts ...outbox.Option) (*outbox.Relay, error) {
		return o.NewRelay(openDB(b, path), mb, opts...)
	})
}
