package sqliteoutbox

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/drain"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/outbox"
	sqlitestore "github.com/idemq/idemq/stores/sqlite"
)

// TestEndToEndMemoryBroker is the whole path on one SQLite file, the
// embedded default: concurrent services write an order and its event in
// one transaction; two relays publish to the memory broker (which
// duplicates 5% of publishes), killed between a confirm and its mark
// (their connections closed, rolling back the claim) every fourth batch,
// three times each at most; idemq consumers on stores/sqlite, in the same
// file, apply the effects, crashing between commit and ack (the broker's
// CrashOnAck fault) and being restarted by memory.Drain. Every order gets
// exactly one effect, none is lost, and per customer the effects follow
// commit order.
func TestEndToEndMemoryBroker(t *testing.T) {
	ctx := context.Background()
	path := tempPath(t)
	admin := openDB(t, path)
	o := newOutbox(t, admin)
	for _, s := range []string{
		`CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, n INTEGER NOT NULL)`,
		`CREATE TABLE effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, order_id TEXT NOT NULL, customer TEXT NOT NULL, n INTEGER NOT NULL)`,
		`CREATE TABLE counters (customer TEXT PRIMARY KEY, n INTEGER NOT NULL)`,
	} {
		if _, err := admin.Exec(s); err != nil {
			t.Fatal(err)
		}
	}
	store, err := sqlitestore.Open(ctx, path, sqlitestore.WithTable("processed"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	const customers, perCustomer, writers = 8, 60, 4
	const total = customers * perCustomer
	for c := range customers {
		admin.Exec(`INSERT INTO counters VALUES (?, 0)`, fmt.Sprint("c", c))
	}
	broker, err := memory.NewBroker(memory.WithFaults(memory.Faults{DuplicatePublish: 0.05}))
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	queue := "orders"

	runCtx, stopRelays := context.WithCancel(ctx)
	defer stopRelays()
	var relayWG sync.WaitGroup
	relays := make([]*outbox.Relay, 2)
	var kills atomic.Int64
	var pubMu sync.Mutex
	var published []*driver.Message
	for i := range relays {
		db, k := openKillable(t, path)
		batches, myKills := 0, 0
		pub := outbox.PublisherFunc(func(ctx context.Context, dest string, msgs ...*driver.Message) error {
			pubMu.Lock()
			defer pubMu.Unlock()
			if err := broker.Publish(ctx, dest, msgs...); err != nil {
				return err
			}
			published = append(published, msgs...)
			batches++
			if batches%4 == 0 && myKills < 3 {
				myKills++
				kills.Add(1)
				k.kill()
			}
			return nil
		})
		r, err := o.NewRelay(db, pub, outbox.WithBatchSize(16), outbox.WithPollInterval(10*time.Millisecond),
			outbox.WithMaxBackoff(50*time.Millisecond), outbox.WithLogger(discard()))
		if err != nil {
			t.Fatal(err)
		}
		relays[i] = r
		relayWG.Add(1)
		go func() { defer relayWG.Done(); r.Run(runCtx) }()
	}

	work := make(chan int, total)
	for i := range total {
		work <- i
	}
	close(work)
	var wg sync.WaitGroup
	writeErrs := make(chan error, writers)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := placeOrder(ctx, admin, o, queue, fmt.Sprint("c", i%customers)); err != nil {
					writeErrs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(writeErrs)
	for err := range writeErrs {
		t.Fatal(err)
	}
	waitPending(t, o.Store(admin))
	stopRelays()
	relayWG.Wait()
	checkOrder(t, published, customers, perCustomer)

	handler := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		n, err := strconv.Atoi(string(m.Body))
		if err != nil {
			return core.Permanent(err)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO effects (order_id, customer, n) VALUES (?, ?, ?)`, m.ID, m.Key, n)
		return err
	}
	broker.SetFaults(memory.Faults{CrashOnAck: 0.01})
	res, err := drain.Drain(ctx, broker, queue, func(s *memory.Subscription) (*core.Consumer[*sql.Tx], error) {
		return core.New[*sql.Tx](s, store, handler, core.WithName("e2e"),
			// A window of one: core.Consumer decides the deliveries of its window
			// concurrently, so only one at a time keeps the broker's order.
			core.WithConcurrency(1), core.WithWindow(1),
			core.WithLogger(discard()))
	})
	if err != nil {
		t.Fatal(err)
	}

	if n := count(t, admin, `SELECT COUNT(*) FROM orders`); n != total {
		t.Fatalf("%d orders, want %d", n, total)
	}
	if n := count(t, admin, `SELECT COUNT(*) FROM effects`); n != total {
		t.Fatalf("%d effects, want %d (drain %+v)", n, total, res)
	}
	if n := count(t, admin, `SELECT COUNT(*) FROM orders o JOIN effects e ON e.order_id = o.id AND e.n = o.n`); n != total {
		t.Fatalf("%d orders have their effect, want %d", n, total)
	}
	rows, err := admin.Query(`SELECT customer, n FROM effects ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	last := map[string]int{}
	for rows.Next() {
		var c string
		var n int
		rows.Scan(&c, &n)
		if n != last[c]+1 {
			t.Fatalf("customer %s: effect %d applied after %d (drain %+v)", c, n, last[c], res)
		}
		last[c] = n
	}
	// A relay that keeps finding full batches tends to keep SQLite's lock,
	// so the other may publish too few batches to be killed three times.
	if kills.Load() < 3 || res.Crashes == 0 || res.Duplicates == 0 {
		t.Fatalf("%d relay kills, drain %+v: want at least 3 kills, crashes and duplicates", kills.Load(), res)
	}
	for i, r := range relays {
		t.Logf("relay %d: %+v", i, r.Stats())
	}
	t.Logf("%d orders, %d effects; %d relay kills; consumers: %d crashes between commit and ack, %d duplicates absorbed",
		total, total, kills.Load(), res.Crashes, res.Duplicates)
}

// placeOrder writes an order and its event in one transaction; the order's
// per-customer number (counted in the same transaction, so in commit
// order) is the event's body.
func placeOrder(ctx context.Context, db *sql.DB, o *Outbox, queue, customer string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if _, err := tx.Exec(`UPDATE counters SET n = n + 1 WHERE customer = ?`, customer); err != nil {
		return err
	}
	if err := tx.QueryRow(`SELECT n FROM counters WHERE customer = ?`, customer).Scan(&n); err != nil {
		return err
	}
	ev := &outbox.Message{Destination: queue, Key: customer, Body: []byte(strconv.Itoa(n))}
	if err := o.Write(ctx, tx, ev); err != nil {
		return err
	}
	if _, err := tx.Exec(`INSERT INTO orders VALUES (?, ?, ?)`, ev.ID, customer, n); err != nil {
		return err
	}
	return tx.Commit()
}
