// Command outbox shows the producer side of idemq: an order service writes
// each order and its "order placed" event in ONE Postgres transaction
// (pgoutbox.Write), a relay publishes the events to a broker chosen by URL,
// and a billing consumer (idemq on the Postgres store) charges each order
// through a payment API with an idempotency key, remembering the charge in
// an effects table, and writes the invoice in its dedup transaction.
//
//	go run ./examples/outbox                                   # memory broker
//	go run ./examples/outbox -broker 'amqp://guest:guest@127.0.0.1:5672/?queue=orders'
//	go run ./examples/outbox -broker 'kafka://127.0.0.1:9092/orders?group=billing'
//	go run ./examples/outbox -broker 'sqs://orders?region=eu-west-1&dlq=orders-dlq'
//	go run ./examples/outbox -broker 'nats://127.0.0.1:4222/ORDERS?consumer=billing&subject=orders'
//	go run ./examples/outbox --help
//
// The payment API is a fake served in-process over real HTTP; it answers a
// repeated Idempotency-Key with the first charge, as Stripe does. The
// command checks that every order got exactly one invoice and one charge,
// and exits 1 otherwise (2 on bad flags).
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	_ "github.com/idemq/idemq/brokers/kafka"
	_ "github.com/idemq/idemq/brokers/memory"
	_ "github.com/idemq/idemq/brokers/nats"
	_ "github.com/idemq/idemq/brokers/rabbitmq"
	_ "github.com/idemq/idemq/brokers/sqs"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/effects"
	"github.com/idemq/idemq/middleware/tracing"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/pgoutbox"
	"github.com/idemq/idemq/stores/postgres"
)

type settings struct {
	postgres  string
	broker    string
	orders    int
	customers int
	writers   int
	prefix    string
	keep      bool
	timeout   time.Duration
}

func main() {
	s, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// W3C trace context on every event the relay publishes.
	ok, err := run(tracing.InstallPropagator(context.Background()), s, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

func parseFlags(args []string, errOut io.Writer) (settings, error) {
	pg := os.Getenv("IDEMQ_POSTGRES_URL")
	if pg == "" {
		pg = "postgres://postgres@127.0.0.1:5432/test"
	}
	var s settings
	fs := flag.NewFlagSet("outbox", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.StringVar(&s.postgres, "postgres", pg, "Postgres URL (default from IDEMQ_POSTGRES_URL)")
	fs.StringVar(&s.broker, "broker", "mem://orders", "broker URL the events go through (mem://QUEUE, amqp://…?queue=QUEUE, kafka://…, sqs://…, nats://…)")
	fs.IntVar(&s.orders, "n", 300, "orders to place")
	fs.IntVar(&s.customers, "customers", 10, "customers (the events' ordering key)")
	fs.IntVar(&s.writers, "writers", 4, "concurrent order writers")
	fs.StringVar(&s.prefix, "tables", "example", "prefix of the tables this example creates")
	fs.BoolVar(&s.keep, "keep", false, "keep the tables afterwards")
	fs.DurationVar(&s.timeout, "timeout", time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	switch {
	case s.orders < 1:
		return s, fmt.Errorf("-n must be positive, got %d", s.orders)
	case s.customers < 1:
		return s, fmt.Errorf("-customers must be positive, got %d", s.customers)
	case s.writers < 1:
		return s, fmt.Errorf("-writers must be positive, got %d", s.writers)
	}
	return s, nil
}

// OrderPlaced is the event the order service publishes.
type OrderPlaced struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
	Cents    int    `json:"cents"`
}

// placeOrder is the service's write path: the order row and its event
// commit together or not at all.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, ob *pgoutbox.Outbox, orders, customer string, cents int) (string, error) {
	var id string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO `+orders+` (customer, cents) VALUES ($1, $2) RETURNING id::text`, customer, cents).Scan(&id); err != nil {
			return err
		}
		body, _ := json.Marshal(OrderPlaced{OrderID: id, Customer: customer, Cents: cents})
		return ob.Write(ctx, tx, &outbox.Message{
			Destination: "orders",
			Key:         customer, // a customer's events are published in commit order
			Headers:     map[string]string{"type": "order.placed"},
			Body:        body,
		})
	})
	return id, err
}

// paymentAPI is a stand-in for a card processor: it deduplicates on the
// Idempotency-Key header.
type paymentAPI struct {
	calls   atomic.Int64
	mu      sync.Mutex
	charges map[string]string // idempotency key → charge id
}

// ServeHTTP charges once per Idempotency-Key and answers repeats with the
// first charge's id.
func (p *paymentAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := p.calls.Add(1)
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	id, ok := p.charges[key]
	if !ok {
		id = fmt.Sprintf("ch_%06d", n)
		p.charges[key] = id
	}
	p.mu.Unlock()
	io.WriteString(w, id)
}

func run(ctx context.Context, s settings, out io.Writer) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	pool, err := pgxpool.New(ctx, s.postgres)
	if err != nil {
		return false, err
	}
	defer pool.Close()

	orders, invoices := s.prefix+"_orders", s.prefix+"_invoices"
	ob, err := pgoutbox.New(pgoutbox.WithTable(s.prefix + "_outbox"))
	if err != nil {
		return false, err
	}
	// The key secret comes from your secret store in production and stays
	// the same across deploys, so a redelivery derives the same key.
	secret := make([]byte, 32)
	rand.Read(secret)
	keyer, err := effects.NewKeyer(secret)
	if err != nil {
		return false, err
	}
	// WithKeyer: Remember hands the call a context carrying the key of
	// (consumer, message id, purpose); effects.Transport sends it.
	eff, err := effects.NewTable(effects.Postgres, effects.WithTable(s.prefix+"_effects"), effects.WithKeyer(keyer))
	if err != nil {
		return false, err
	}
	store, err := postgres.New(pool, postgres.WithTable(s.prefix+"_processed"))
	if err != nil {
		return false, err
	}
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS ` + orders + ` (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer TEXT NOT NULL, cents INT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS ` + invoices + ` (order_id TEXT NOT NULL, charge TEXT NOT NULL, event_id TEXT NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return false, err
		}
	}
	if !s.keep {
		defer pool.Exec(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS `+orders+`, `+invoices+`, `+ob.Table()+`, `+eff.Name()+`, `+store.Table())
	}
	if err := ob.Migrate(ctx, pool); err != nil {
		return false, err
	}
	if err := eff.Migrate(ctx, pool); err != nil {
		return false, err
	}
	if err := store.Migrate(ctx); err != nil {
		return false, err
	}

	// The relay: the events' "orders" destination is the broker URL.
	pub, err := core.OpenPublisher(ctx, s.broker)
	if err != nil {
		return false, err
	}
	defer pub.Close()
	relay, err := ob.NewRelay(pool, outbox.Destinations(map[string]driver.Publisher{"orders": pub.Driver()}), outbox.WithLogger(log))
	if err != nil {
		return false, err
	}

	// The billing consumer: charge once per order, invoice in the dedup
	// transaction.
	api := &paymentAPI{charges: map[string]string{}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	client := &http.Client{Transport: &effects.Transport{}, Timeout: 5 * time.Second}
	charge := func(ev OrderPlaced) func(ctx context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/charges?order="+ev.OrderID, nil)
			resp, err := client.Do(req) // carries the Idempotency-Key Remember put in ctx
			if err != nil {
				return nil, err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("payment API: %s: %s", resp.Status, b)
			}
			return b, err
		}
	}
	handler := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		var ev OrderPlaced
		if err := json.Unmarshal(m.Body, &ev); err != nil {
			return core.Permanent(err)
		}
		// On the pool, not tx: the charge's record must survive this
		// transaction rolling back, which is when the handler runs again.
		ch, err := eff.Remember(ctx, pool, core.ConsumerName(ctx), m.ID, "charge", charge(ev))
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+invoices+` (order_id, charge, event_id) VALUES ($1, $2, $3)`, ev.OrderID, string(ch), m.ID)
		return err
	}
	src, err := core.OpenSource(ctx, s.broker)
	if err != nil {
		return false, err
	}
	consumer, err := core.New[pgx.Tx](src, store, handler, core.WithName("billing"), core.WithLogger(log))
	if err != nil {
		src.Close()
		return false, err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); relay.Run(runCtx) }()
	go func() { defer wg.Done(); consumer.Run(runCtx) }()

	start := time.Now()
	work := make(chan int, s.orders)
	for i := range s.orders {
		work <- i
	}
	close(work)
	var writers sync.WaitGroup
	var writeErr atomic.Pointer[error]
	for range s.writers {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range work {
				if _, err := placeOrder(ctx, pool, ob, orders, fmt.Sprint("customer-", i%s.customers), 100+i); err != nil {
					writeErr.Store(&err)
					return
				}
			}
		}()
	}
	writers.Wait()
	if p := writeErr.Load(); p != nil {
		return false, fmt.Errorf("placing orders: %w", *p)
	}
	placed := time.Since(start)

	count := func(q string) int {
		var n int
		pool.QueryRow(ctx, q).Scan(&n)
		return n
	}
	for count(`SELECT count(*) FROM `+invoices) < s.orders && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	stop()
	wg.Wait()

	nOrders := count(`SELECT count(*) FROM ` + orders)
	nInvoices := count(`SELECT count(*) FROM ` + invoices)
	invoiced := count(`SELECT count(DISTINCT order_id) FROM ` + invoices)
	twice := count(`SELECT count(*) FROM (SELECT order_id FROM ` + invoices + ` GROUP BY order_id HAVING count(*) > 1) x`)
	pending, _, _ := ob.Store(pool).Pending(ctx)
	api.mu.Lock()
	charges := len(api.charges)
	api.mu.Unlock()
	rs := relay.Stats()
	cs := consumer.Stats()
	fmt.Fprintf(out, "broker            %s\n", core.Redact(s.broker))
	fmt.Fprintf(out, "orders placed     %d in %v (order row + event in one transaction)\n", nOrders, placed.Round(time.Millisecond))
	fmt.Fprintf(out, "events published  %d (relay claims %d, pending %d)\n", rs.Published, rs.Claims, pending)
	fmt.Fprintf(out, "consumer          %d processed, %d duplicates\n", cs.Processed, cs.Duplicates)
	fmt.Fprintf(out, "invoices          %d for %d orders, %d orders invoiced twice\n", nInvoices, invoiced, twice)
	fmt.Fprintf(out, "payment API       %d calls, %d charges\n", api.calls.Load(), charges)
	fmt.Fprintf(out, "end to end        %v, %.0f orders/s\n", elapsed.Round(time.Millisecond), float64(s.orders)/elapsed.Seconds())
	if nOrders == s.orders && nInvoices == s.orders && invoiced == s.orders && twice == 0 && charges == s.orders {
		fmt.Fprintln(out, "OK: every order has exactly one invoice and one charge")
		return true, nil
	}
	fmt.Fprintln(out, "FAILED: orders, invoices and charges do not match one to one")
	return false, ctx.Err()
}
