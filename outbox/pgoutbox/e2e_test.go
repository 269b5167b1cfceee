package pgoutbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/brokers/rabbitmq"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/stores/postgres"
)

// amqpURL returns IDEMQ_AMQP_URL (default the local broker); unreachable
// skips the test, or fails it with IDEMQ_REQUIRE_SERVICES=1.
func amqpURL(t testing.TB) string {
	t.Helper()
	return servicetest.RabbitMQURL(t)
}

// declareQueue lets the rabbitmq source declare its queue (and dead-letter
// queue) and deletes them at the end.
func declareQueue(t testing.TB, url, name string) {
	t.Helper()
	src, err := rabbitmq.Open(context.Background(), url, rabbitmq.WithQueue(name), rabbitmq.WithLogger(discard()))
	if err != nil {
		t.Fatal(err)
	}
	src.Close()
	servicetest.DeleteQueuesAtCleanup(t, url, name)
}

// crashingSource closes the real source on its crashAt-th Ack call
// instead of acknowledging: the consumer process committed its effects and
// died before the ack, so RabbitMQ redelivers everything it held.
type crashingSource struct {
	*rabbitmq.Source
	crashAt int64
	acks    atomic.Int64
}

func (c *crashingSource) Ack(ctx context.Context, ms []*driver.Message) error {
	if c.crashAt > 0 && c.acks.Add(1) == c.crashAt {
		c.Source.Close()
		return errors.New("crashed between commit and ack")
	}
	return c.Source.Ack(ctx, ms)
}

// TestEndToEndRabbitMQ is the whole path: concurrent services write an
// order and its event in one transaction; two relays publish to RabbitMQ
// with confirms, each killed (its database session terminated) between a
// confirm and the mark three times; an idemq consumer (core.New with the
// Postgres store) applies each event's effect, crashing between commit and
// ack twice. Every order gets exactly one effect, none is lost, and each
// customer's effects are applied in commit order.
func TestEndToEndRabbitMQ(t *testing.T) {
	pgURL := postgresURL(t)
	amqpU := amqpURL(t)
	ctx := context.Background()
	sfx := suffix()
	queue := "idemq-outbox-e2e-" + sfx
	declareQueue(t, amqpU, queue)

	admin := newPool(t, pgURL, "pgoutbox-admin")
	o := newOutbox(t, admin)
	orders, effects, counters := "e2e_orders_"+sfx, "e2e_effects_"+sfx, "e2e_counters_"+sfx
	store, err := postgres.Open(ctx, pgURL, postgres.WithTable("e2e_processed_"+sfx))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		`CREATE TABLE ` + orders + ` (id TEXT PRIMARY KEY, customer TEXT NOT NULL, n INT NOT NULL)`,
		`CREATE TABLE ` + effects + ` (seq BIGSERIAL PRIMARY KEY, order_id TEXT NOT NULL, customer TEXT NOT NULL, n INT NOT NULL)`,
		`CREATE TABLE ` + counters + ` (customer TEXT PRIMARY KEY, n INT NOT NULL)`,
	} {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		admin.Exec(context.Background(), `DROP TABLE IF EXISTS `+orders+`, `+effects+`, `+counters+`, e2e_processed_`+sfx)
	})

	const customers, perCustomer, writers = 10, 100, 4
	const total = customers * perCustomer
	for c := range customers {
		admin.Exec(ctx, `INSERT INTO `+counters+` VALUES ($1, 0)`, fmt.Sprint("c", c))
	}

	// Two relays, each on its own pool so that killing one's session
	// leaves the other alone.
	runCtx, stopRelays := context.WithCancel(ctx)
	defer stopRelays()
	var relayWG sync.WaitGroup
	relays := make([]*outbox.Relay, 2)
	var kills atomic.Int64
	var pubMu sync.Mutex
	var published []*driver.Message
	for i := range relays {
		app := fmt.Sprintf("outbox-relay-%d-%s", i, sfx)
		pool := newPool(t, pgURL, app)
		pub, err := rabbitmq.NewPublisher(ctx, amqpU)
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		batches, myKills := 0, 0
		killing := outbox.PublisherFunc(func(ctx context.Context, dest string, msgs ...*driver.Message) error {
			// Serialized so that the record is the broker's order.
			pubMu.Lock()
			defer pubMu.Unlock()
			if err := pub.Publish(ctx, dest, msgs...); err != nil {
				return err
			}
			for _, m := range msgs {
				c := *m
				c.Key = m.Headers["customer"]
				published = append(published, &c)
			}
			batches++
			if batches%5 == 0 && myKills < 3 {
				myKills++
				kills.Add(1)
				admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app)
			}
			return nil
		})
		r, err := o.NewRelay(pool, killing, outbox.WithBatchSize(20), outbox.WithPollInterval(20*time.Millisecond),
			outbox.WithMaxBackoff(50*time.Millisecond), outbox.WithName(app), outbox.WithLogger(discard()))
		if err != nil {
			t.Fatal(err)
		}
		relays[i] = r
		relayWG.Add(1)
		go func() { defer relayWG.Done(); r.Run(runCtx) }()
	}

	// The services: each order and its event in one transaction.
	writerPool := newPool(t, pgURL, "outbox-writers-"+sfx)
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
				customer := fmt.Sprint("c", i%customers)
				err := pgx.BeginFunc(ctx, writerPool, func(tx pgx.Tx) error {
					// AMQP has no ordering key: the customer also travels
					// as a header.
					ev := &outbox.Message{Destination: queue, Key: customer, Headers: map[string]string{"customer": customer}}
					if err := o.Write(ctx, tx, ev); err != nil {
						return err
					}
					var n int
					if err := tx.QueryRow(ctx, `UPDATE `+counters+` SET n = n + 1 WHERE customer = $1 RETURNING n`, customer).Scan(&n); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` VALUES ($1, $2, $3)`, ev.ID, customer, n); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `UPDATE `+o.ident+` SET body = $1 WHERE id = $2`, []byte(strconv.Itoa(n)), ev.ID)
					return err
				})
				if err != nil {
					writeErrs <- err
					return
				}
			}
		}()
	}

	handler := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		n, err := strconv.Atoi(string(m.Body))
		if err != nil {
			return core.Permanent(err)
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+effects+` (order_id, customer, n) VALUES ($1, $2, $3)`, m.ID, m.Headers["customer"], n)
		return err
	}
	applied := func() int { return count(t, admin, `SELECT count(*) FROM `+effects) }
	crashes := 0
	deadline := time.Now().Add(90 * time.Second)
	for life := 1; applied() < total; life++ {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d effects after 90s", applied(), total)
		}
		src, err := rabbitmq.Open(ctx, amqpU, rabbitmq.WithQueue(queue), rabbitmq.WithLogger(discard()))
		if err != nil {
			t.Fatal(err)
		}
		cs := &crashingSource{Source: src}
		if life <= 2 {
			cs.crashAt = 15
		}
		c, err := core.New[pgx.Tx](cs, store, handler, core.WithName("e2e"),
			// A window of one: core.Consumer decides the deliveries of its window
			// concurrently, so only one at a time keeps the broker's order.
			core.WithConcurrency(1), core.WithWindow(1),
			core.WithLogger(discard()))
		if err != nil {
			t.Fatal(err)
		}
		cctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(cctx) }()
		crashed := false
		for !crashed {
			select {
			case <-done:
				crashed = true
				crashes++
				continue
			case <-time.After(50 * time.Millisecond):
			}
			if (cs.crashAt == 0 && applied() >= total) || time.Now().After(deadline) {
				break
			}
		}
		stop()
		if !crashed {
			<-done
		}
		src.Close()
	}
	wg.Wait()
	close(writeErrs)
	for err := range writeErrs {
		t.Fatal(err)
	}
	stopRelays()
	relayWG.Wait()
	pubMu.Lock()
	checkOrder(t, published, customers, perCustomer)
	pubMu.Unlock()

	// Exactly one effect per order, none lost, none invented.
	if n := count(t, admin, `SELECT count(*) FROM `+orders); n != total {
		t.Fatalf("%d orders written, want %d", n, total)
	}
	if n := applied(); n != total {
		t.Fatalf("%d effects, want %d", n, total)
	}
	if n := count(t, admin, `SELECT count(*) FROM `+orders+` o JOIN `+effects+` e ON e.order_id = o.id AND e.n = o.n`); n != total {
		t.Fatalf("%d orders have their effect, want %d", n, total)
	}
	// Per customer, effects in commit order.
	rows, err := admin.Query(ctx, `SELECT customer, n FROM `+effects+` ORDER BY seq`)
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
			t.Fatalf("customer %s: effect %d applied after %d", c, n, last[c])
		}
		last[c] = n
	}
	if n := count(t, admin, `SELECT count(*) FROM `+o.ident+` WHERE sent_at IS NULL`); n != 0 {
		t.Fatalf("%d outbox rows pending", n)
	}
	for i, r := range relays {
		st := r.Stats()
		if st.Published == 0 {
			t.Errorf("relay %d published nothing", i)
		}
		t.Logf("relay %d: %+v", i, st)
	}
	if kills.Load() != 6 || crashes < 2 {
		t.Fatalf("%d relay kills and %d consumer crashes, want 6 and at least 2", kills.Load(), crashes)
	}
	t.Logf("%d orders, %d effects, %d relay kills between publish and mark, %d consumer crashes between commit and ack", total, applied(), kills.Load(), crashes)
}

func purge(t testing.TB, url, queue string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueuePurge(queue, false); err != nil {
		t.Fatal(err)
	}
}
