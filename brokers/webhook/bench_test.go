package webhook

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
)

// benchClients is how many senders post at once, as a provider's delivery
// workers do.
const benchClients = 16

// BenchmarkWebhookPostgres posts b.N signed GitHub events (one in ten a
// copy of an earlier one) from benchClients senders to two endpoints doing
// the same work, alternating under -count: "hand" is a handler written
// without idemq (verify, then one transaction: INSERT … ON CONFLICT DO
// NOTHING into a claims table and, when inserted, the effect row; 200
// after the commit), "idemq" a Source with a Consumer on the Postgres
// store running one transaction per request too, and "idemq-batch" the
// same Consumer letting the requests in flight share transactions. It reports requests per second and the 99th percentile latency,
// and checks every event applied exactly once.
func BenchmarkWebhookPostgres(b *testing.B) {
	url := servicetest.PostgresURL(b)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = benchClients // a connection for every sender: neither side waits for the pool
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	for _, stmt := range []string{
		`DROP TABLE IF EXISTS bench_webhook_effects, bench_webhook_claims, bench_webhook_idemq`,
		`CREATE TABLE bench_webhook_effects (id TEXT NOT NULL, body TEXT NOT NULL)`,
		`CREATE TABLE bench_webhook_claims (id TEXT PRIMARY KEY, claimed_at TIMESTAMPTZ NOT NULL DEFAULT now())`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			b.Fatal(err)
		}
	}
	profile, err := signature.GitHub([]string{ghSecret})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("hand", func(b *testing.B) {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, DefaultMaxBody))
			if err != nil {
				http.Error(w, "bad body", http.StatusBadRequest)
				return
			}
			ev, err := profile.Verify(r.Header, body, time.Now())
			if err != nil {
				http.Error(w, "not verified", http.StatusUnauthorized)
				return
			}
			err = pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
				tag, err := tx.Exec(r.Context(), `INSERT INTO bench_webhook_claims (id) VALUES ($1) ON CONFLICT DO NOTHING`, ev.ID)
				if err != nil || tag.RowsAffected() == 0 {
					return err
				}
				_, err = tx.Exec(r.Context(), `INSERT INTO bench_webhook_effects (id, body) VALUES ($1, $2)`, ev.ID, string(body))
				return err
			})
			if err != nil {
				w.Header().Set("Retry-After", "1")
				http.Error(w, "retry later", http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusOK)
		})
		benchEndpoint(b, pool, h)
	})
	// idemq runs one transaction per request, as "hand" does;
	// idemq-batch lets the requests in flight share transactions.
	for _, cfg := range []struct {
		name string
		opts []core.Option
	}{
		{"idemq", []core.Option{core.WithConcurrency(benchClients)}},
		{"idemq-batch", []core.Option{core.WithBatchSize(benchClients), core.WithConcurrency(2)}},
	} {
		b.Run(cfg.name, func(b *testing.B) {
			store, err := postgres.New(pool, postgres.WithTable("bench_webhook_idemq"))
			if err != nil {
				b.Fatal(err)
			}
			if err := store.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			src, err := NewSource(WithProfile(profile), WithParkDir(b.TempDir()))
			if err != nil {
				b.Fatal(err)
			}
			c, err := core.New(src, store, func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
				_, err := tx.Exec(ctx, `INSERT INTO bench_webhook_effects (id, body) VALUES ($1, $2)`, m.ID, string(m.Body))
				return err
			}, append([]core.Option{core.WithName("bench")}, cfg.opts...)...)
			if err != nil {
				b.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() { ran <- c.Run(runCtx) }()
			benchEndpoint(b, pool, src)
			stop()
			if err := <-ran; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// run numbers the endpoint runs, so that every run posts fresh ids.
var run atomic.Int64

// benchEndpoint serves h over loopback HTTP and posts b.N signed events to
// it from benchClients senders, every tenth a copy of the one before,
// resending on any answer but 200; then it checks that every event has
// exactly one effect row and reports req/s and p99-ms.
func benchEndpoint(b *testing.B, pool *pgxpool.Pool, h http.Handler) {
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `TRUNCATE bench_webhook_effects`); err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchClients}}
	defer client.CloseIdleConnections()
	prefix := "r" + strconv.FormatInt(run.Add(1), 10) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	reqs := make([]*http.Request, b.N)
	events := 0
	for i := range reqs {
		id := i
		if i%10 == 9 {
			id = i - 1 // a copy of the event before
		} else {
			events++
		}
		reqs[i] = githubRequest(b, srv.URL, prefix+strconv.Itoa(id), `{"action":"opened","n":`+strconv.Itoa(id)+`}`)
	}
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range benchClients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(reqs) {
					return
				}
				t0 := time.Now()
				if err := postUntilOK(client, reqs[i]); err != nil {
					failed.Store(err)
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	var rows, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM bench_webhook_effects WHERE id LIKE $1`, prefix+"%").Scan(&rows, &distinct); err != nil {
		b.Fatal(err)
	}
	if rows != events || distinct != events {
		b.Fatalf("%d effect rows for %d distinct ids, want %d events applied once each", rows, distinct, events)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(lat[len(lat)*99/100])/float64(time.Millisecond), "p99-ms")
	b.ReportMetric(0, "ns/op") // throughput and latency say it; ns/op of concurrent senders would mislead
}

// postUntilOK sends r until it is answered 200, as a provider does.
func postUntilOK(client *http.Client, r *http.Request) error {
	last := ""
	for try := 0; try < 50; try++ {
		req := r.Clone(r.Context())
		req.Body, _ = r.GetBody()
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		text, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = resp.Status + " " + string(text)
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("no 200 after 50 tries: " + r.Header.Get(signature.HeaderGitHubDelivery) + ": " + last)
}
