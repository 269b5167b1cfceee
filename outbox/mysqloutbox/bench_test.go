package mysqloutbox

import (
	"fmt"
	"testing"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/internal/outboxtest"
)

// BenchmarkRelay measures how fast one or two relays drain a backlog of
// 10,000 rows (written beforehand, untimed) into the memory broker, with
// rows without an ordering key and with 100 keys. It reports msgs/s.
func BenchmarkRelay(b *testing.B) {
	url := mysqlURL(b)
	for _, keys := range []int{0, 100} {
		for _, relays := range []int{1, 2} {
			b.Run(fmt.Sprintf("keys=%d/relays=%d", keys, relays), func(b *testing.B) {
				benchRelay(b, url, 10000, keys, relays)
			})
		}
	}
}

func benchRelay(b *testing.B, url string, rows, keys, relays int) {
	db := openDB(b, url)
	o := newOutbox(b, db)
	mb, _ := memory.NewBroker()
	defer mb.Close()
	outboxtest.BenchRelay(b, rows, keys, relays, o.Store(db), outboxtest.TxWrite(db, o.Write), func(opts ...outbox.Option) (*outbox.Relay, error) {
		return o.NewRelay(openDB(b, url), mb, opts...)
	})
}
