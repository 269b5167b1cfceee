package effects

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/drain"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func TestIdempotencyKey(t *testing.T) {
	k, err := IdempotencyKey(secret, "billing", "order-42", "charge")
	if err != nil {
		t.Fatal(err)
	}
	// Computed independently (Python hmac, uvarint length prefixes).
	if want := "KSMkemfZo8E3nsRVszFG7xECsVTDe9G-8NXOTBSHph8"; k != want {
		t.Fatalf("key %q, want %q", k, want)
	}
	seen := map[string]string{k: "base"}
	for name, args := range map[string][3]string{
		"consumer": {"shipping", "order-42", "charge"},
		"id":       {"billing", "order-43", "charge"},
		"purpose":  {"billing", "order-42", "receipt-email"},
		"boundary": {"billingo", "rder-42", "charge"},
		"empty":    {"", "billingorder-42", "charge"},
	} {
		k2, _ := IdempotencyKey(secret, args[0], args[1], args[2])
		if prev, dup := seen[k2]; dup {
			t.Errorf("%s: same key as %s", name, prev)
		}
		seen[k2] = name
	}
	other, _ := IdempotencyKey([]byte("another secret, 32 bytes long!!!"), "billing", "order-42", "charge")
	if other == k {
		t.Error("key does not depend on the secret")
	}
	if _, err := IdempotencyKey([]byte("short"), "c", "i", "p"); err == nil || !strings.Contains(err.Error(), "secret") {
		t.Errorf("short secret: %v", err)
	}
}

func TestTransport(t *testing.T) {
	var got []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Idempotency-Key")+"|"+r.Header.Get("PayPal-Request-Id"))
		mu.Unlock()
	}))
	defer srv.Close()
	kr, _ := NewKeyer(secret)
	do := func(c *http.Client, ctx context.Context, preset string) *http.Request {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, nil)
		if preset != "" {
			req.Header.Set("Idempotency-Key", preset)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return req
	}
	key := kr.Key("billing", "order-42", "charge")
	plain := &http.Client{Transport: &Transport{}}
	req := do(plain, WithIdempotencyKey(context.Background(), key), "")
	do(plain, context.Background(), "")
	do(plain, WithIdempotencyKey(context.Background(), key), "caller-set")
	do(&http.Client{Transport: &Transport{Quote: true}}, WithIdempotencyKey(context.Background(), key), "")
	do(&http.Client{Transport: &Transport{Header: "PayPal-Request-Id"}}, WithIdempotencyKey(context.Background(), key), "")
	want := []string{key + "|", "|", "caller-set|", `"` + key + `"|`, "|" + key}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("headers sent %q, want %q", got, want)
	}
	if req.Header.Get("Idempotency-Key") != "" {
		t.Fatal("Transport modified the caller's request")
	}
}

// serviceURL returns the URL in env (or def) once ping reaches it;
// unreachable skips, or fails with IDEMQ_REQUIRE_SERVICES=1.
func serviceURL(t testing.TB, env, def string, ping func(string) error) string {
	t.Helper()
	return servicetest.URL(t, env, def, func(_ context.Context, u string) error { return ping(u) })
}

// postgresURL returns IDEMQ_POSTGRES_URL (default the local server);
// unreachable skips, or fails with IDEMQ_REQUIRE_SERVICES=1.
func postgresURL(t testing.TB) string {
	t.Helper()
	return servicetest.PostgresURL(t)
}

// mysqlURL returns IDEMQ_MYSQL_URL (default the local MariaDB); unreachable
// skips, or fails with IDEMQ_REQUIRE_SERVICES=1.
func mysqlURL(t testing.TB) string {
	t.Helper()
	return servicetest.MySQLURL(t)
}

func suffix() string {
	b := make([]byte, 5)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// provider is a fake payment API over real HTTP: it counts calls and
// answers a repeated Idempotency-Key with the charge it made the first
// time, as Stripe does.
type provider struct {
	srv     *httptest.Server
	calls   atomic.Int64
	mu      sync.Mutex
	charges map[string]string // key → charge id
}

func newProvider(t testing.TB) *provider {
	p := &provider{charges: map[string]string{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := p.calls.Add(1)
		key := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		id, ok := p.charges[key]
		if !ok || key == "" {
			id = fmt.Sprintf("ch_%d", n)
			p.charges[key] = id
		}
		p.mu.Unlock()
		io.WriteString(w, id)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) charge(ctx context.Context) ([]byte, error) {
	req, _ := http.NewRequestWithContext(ctx, "POST", p.srv.URL, nil)
	resp, err := (&http.Client{Transport: &Transport{}}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// TestRememberInConsumer runs an idemq consumer (memory broker, Postgres
// store) whose handler charges a card and then fails on its first attempt,
// rolling the business transaction back. With the result remembered on the
// pool, the retry reuses it: one call. With the result remembered in the
// handler's transaction, the record rolls back too and the retry calls
// again, but the idempotency key makes the provider return the same charge.
func TestRememberInConsumer(t *testing.T) {
	url := postgresURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	kr, _ := NewKeyer(secret)

	for _, inTx := range []bool{false, true} {
		t.Run(fmt.Sprintf("inTx=%v", inTx), func(t *testing.T) {
			sfx := suffix()
			tbl, err := NewTable(Postgres, WithTable("effects_"+sfx), WithKeyer(kr))
			if err != nil {
				t.Fatal(err)
			}
			if err := tbl.Migrate(ctx, pool); err != nil {
				t.Fatal(err)
			}
			payments := "payments_" + sfx
			pool.Exec(ctx, `CREATE TABLE `+payments+` (order_id TEXT PRIMARY KEY, charge TEXT NOT NULL)`)
			store, err := postgres.New(pool, postgres.WithTable("processed_"+sfx))
			if err != nil {
				t.Fatal(err)
			}
			store.Migrate(ctx)
			t.Cleanup(func() { pool.Exec(ctx, `DROP TABLE IF EXISTS `+payments+`, effects_`+sfx+`, processed_`+sfx) })

			p := newProvider(t)
			b, _ := memory.NewBroker()
			defer b.Close()
			const orders = 5
			for i := range orders {
				core.NewPublisher(b).Publish(ctx, "orders", &core.Message{ID: fmt.Sprint("order-", i), Body: []byte("{}")})
			}
			var attempts sync.Map
			var wrongKey atomic.Int64
			handler := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
				if k, _ := IdempotencyKeyFrom(kr.ForMessage(ctx, m, "charge")); k != kr.Key("billing", m.ID, "charge") {
					wrongKey.Add(1)
				}
				var db any = pool
				if inTx {
					db = tx
				}
				charge, err := tbl.Remember(ctx, db, core.ConsumerName(ctx), m.ID, "charge", p.charge)
				if err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO `+payments+` VALUES ($1, $2)`, m.ID, string(charge)); err != nil {
					return err
				}
				if _, again := attempts.LoadOrStore(m.ID, true); !again {
					return errors.New("database hiccup after the charge") // rolls back; retried
				}
				return nil
			}
			res, err := drain.Drain(ctx, b, "orders", func(s *memory.Subscription) (*core.Consumer[pgx.Tx], error) {
				return core.New[pgx.Tx](s, store, handler, core.WithName("billing"),
					core.WithBackoff(core.ConstantBackoff(time.Millisecond)), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			})
			if err != nil {
				t.Fatal(err)
			}
			if wrongKey.Load() != 0 {
				t.Fatalf("Keyer.ForMessage gave %d wrong keys", wrongKey.Load())
			}
			if res.Processed != orders || res.Retried != orders {
				t.Fatalf("drain %+v: want %d processed after %d retries", res, orders, orders)
			}
			var rows, distinct int
			pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT charge) FROM `+payments).Scan(&rows, &distinct)
			if rows != orders || distinct != orders {
				t.Fatalf("%d payments with %d distinct charges, want %d", rows, distinct, orders)
			}
			wantCalls := int64(orders)
			if inTx {
				wantCalls = 2 * orders // called again, deduplicated by the key
			}
			if c := p.calls.Load(); c != wantCalls {
				t.Fatalf("provider called %d times, want %d", c, wantCalls)
			}
			if len(p.charges) != orders {
				t.Fatalf("provider made %d charges, want %d", len(p.charges), orders)
			}
			for key := range p.charges {
				if want := kr.Key("billing", "order-0", "charge"); key == want {
					return
				}
			}
			t.Fatal("the provider never saw the key of (billing, order-0, charge)")
		})
	}
}

// TestRememberMySQL: a recorded result is returned without calling; a
// record in a rolled-back transaction is forgotten; racing runs return the
// first recorded result; Prune deletes old records.
func TestRememberMySQL(t *testing.T) {
	url := mysqlURL(t)
	ctx := context.Background()
	db, err := sql.Open("mysql", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tbl, err := NewTable(MySQL, WithTable("effects_"+suffix()))
	if err != nil {
		t.Fatal(err)
	}
	if err := tbl.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	defer db.Exec("DROP TABLE " + tbl.Name())
	var calls atomic.Int64
	call := func(context.Context) ([]byte, error) {
		n := calls.Add(1)
		time.Sleep(20 * time.Millisecond)
		return []byte(fmt.Sprint("result-", n)), nil
	}

	r1, err := tbl.Remember(ctx, db, "c", "m1", "charge", call)
	if err != nil || string(r1) != "result-1" {
		t.Fatalf("first Remember = %q, %v", r1, err)
	}
	r2, err := tbl.Remember(ctx, db, "c", "m1", "charge", call)
	if err != nil || string(r2) != "result-1" || calls.Load() != 1 {
		t.Fatalf("second Remember = %q, %v after %d calls; want the stored result and no call", r2, err, calls.Load())
	}
	if _, err := tbl.Remember(ctx, db, "c", "m1", "fail", func(context.Context) ([]byte, error) { return nil, errors.New("boom") }); err == nil {
		t.Fatal("call error not returned")
	}
	r3, _ := tbl.Remember(ctx, db, "c", "m1", "fail", call)
	if string(r3) != "result-2" {
		t.Fatalf("a failed call was recorded: %q", r3)
	}

	// In a rolled-back transaction the record goes with it.
	tx, _ := db.BeginTx(ctx, nil)
	if _, err := tbl.Remember(ctx, tx, "c", "m2", "charge", call); err != nil {
		t.Fatal(err)
	}
	tx.Rollback()
	r4, _ := tbl.Remember(ctx, db, "c", "m2", "charge", call)
	if string(r4) != "result-4" {
		t.Fatalf("after rollback got %q, want a new call's result-4", r4)
	}

	// Racing runs: all return the same (first recorded) result.
	var wg sync.WaitGroup
	results := make([]string, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := tbl.Remember(ctx, db, "c", "m3", "charge", call)
			if err != nil {
				t.Error(err)
			}
			results[i] = string(r)
		}()
	}
	wg.Wait()
	for _, r := range results[1:] {
		if r != results[0] {
			t.Fatalf("racing runs returned different results %q", results)
		}
	}

	if _, err := tbl.Remember(ctx, &pgxpool.Pool{}, "c", "m", "p", call); err == nil || !strings.Contains(err.Error(), "database/sql") {
		t.Fatalf("wrong handle type: %v", err)
	}
	n, err := tbl.Prune(ctx, db, time.Now().Add(time.Hour), 2)
	if err != nil || n != 2 {
		t.Fatalf("Prune = %d, %v; want 2", n, err)
	}
	n, _ = tbl.Prune(ctx, db, time.Now().Add(time.Hour), 100)
	if n != 2 {
		t.Fatalf("second Prune = %d, want the 2 left", n)
	}
	if _, err := NewTable(MySQL, WithTable("no-dash")); err == nil || !strings.Contains(err.Error(), "WithTable") {
		t.Fatalf("bad table name: %v", err)
	}
}
