package idempotency

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/storetest"
	"github.com/jackc/pgx/v5"
)

// BenchmarkPostgres compares, over loopback HTTP, the middleware with a
// hand-written handler that runs the same transaction without leases:
// INSERT … ON CONFLICT DO NOTHING of the key's claim, the effect, and the
// response stored, in one transaction; and with that handler behind the
// leanest hand-written lease (one autocommitted upsert before, a fencing
// DELETE in the transaction). Every request has a new key.
// Metrics: req/s and the 99th percentile latency. Run the two
// interleaved (-count) in the same run to compare them.
func BenchmarkPostgres(b *testing.B) {
	ctx := context.Background()
	n := newNames(b)
	f := open(b, "postgres", n, true)
	s, err := postgres.Open(ctx, servicetest.PostgresURL(b), postgres.WithTable(n.Claims))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	pool := s.Pool()
	hc, hr, hl := storetest.UniqueName("idemq_hand_c_"), storetest.UniqueName("idemq_hand_r_"), storetest.UniqueName("idemq_hand_l_")
	for _, q := range []string{
		`CREATE TABLE ` + hc + ` (consumer TEXT NOT NULL, message_id TEXT NOT NULL, fingerprint TEXT NOT NULL DEFAULT '', processed_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (consumer, message_id))`,
		`CREATE TABLE ` + hr + ` (LIKE ` + n.Responses + ` INCLUDING ALL)`,
		`CREATE TABLE ` + hl + ` (consumer TEXT NOT NULL, message_id TEXT NOT NULL, token BIGINT NOT NULL, lease_until TIMESTAMPTZ NOT NULL, PRIMARY KEY (consumer, message_id))`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+hc+`, `+hr+`, `+hl) })

	effect := func(ctx context.Context, tx pgx.Tx, order string) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+n.Effects+` (k) VALUES ($1)`, order)
		return err
	}
	respond := func(w http.ResponseWriter, order string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q}`, order)
	}
	m, err := New(s, WithTable(n.Responses), WithScope(testScope))
	if err != nil {
		b.Fatal(err)
	}
	mw := m.Handler(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		order := r.URL.Query().Get("o")
		if err := effect(r.Context(), tx, order); err != nil {
			return err
		}
		respond(w, order)
		return nil
	})
	hand := func(leased bool) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			key := strings.Trim(r.Header.Get(HeaderKey), `"`)
			body, err := io.ReadAll(r.Body)
			if err != nil || key == "" {
				http.Error(w, "bad request", http.StatusBadRequest)
				return
			}
			order := r.URL.Query().Get("o")
			fail := func(err error) { http.Error(w, err.Error(), http.StatusInternalServerError) }
			var token int64
			if leased {
				// The leanest lease: one autocommitted upsert that takes
				// a free or expired lease row.
				err := pool.QueryRow(ctx, `INSERT INTO `+hl+` AS l (consumer, message_id, token, lease_until) VALUES ($1, $2, 1, now() + interval '30 seconds')
ON CONFLICT (consumer, message_id) DO UPDATE SET token = l.token + 1, lease_until = EXCLUDED.lease_until WHERE l.lease_until < now() RETURNING token`, "hand", key).Scan(&token)
				if err != nil {
					fail(err)
					return
				}
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				fail(err)
				return
			}
			defer tx.Rollback(ctx)
			tag, err := tx.Exec(ctx, `INSERT INTO `+hc+` (consumer, message_id, fingerprint, processed_at) VALUES ($1, $2, $3, now()) ON CONFLICT DO NOTHING`, "hand", key, fmt.Sprint(len(body)))
			if err != nil {
				fail(err)
				return
			}
			if tag.RowsAffected() == 0 {
				http.Error(w, "duplicate", http.StatusConflict) // not reached: every key is new
				return
			}
			if err := effect(ctx, tx, order); err != nil {
				fail(err)
				return
			}
			if leased {
				tag, err := tx.Exec(ctx, `DELETE FROM `+hl+` WHERE consumer = $1 AND message_id = $2 AND token = $3`, "hand", key, token)
				if err != nil || tag.RowsAffected() != 1 {
					fail(fmt.Errorf("fence: %v", err))
					return
				}
			}
			resp := fmt.Sprintf(`{"order":%q}`, order)
			if _, err := tx.Exec(ctx, `INSERT INTO `+hr+` (consumer, message_id, status, header, body, stored_at) VALUES ($1, $2, $3, $4, $5, now())`,
				"hand", key, http.StatusCreated, "Content-Type: application/json\r\n", []byte(resp)); err != nil {
				fail(err)
				return
			}
			if err := tx.Commit(ctx); err != nil {
				fail(err)
				return
			}
			respond(w, order)
		})
	}
	_ = f
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"middleware", mw}, {"hand-written", hand(false)}, {"hand-written-leased", hand(true)}} {
		b.Run(c.name, func(b *testing.B) { benchServe(b, c.h) })
	}
}

// benchServe posts b.N requests with new keys to h over loopback HTTP
// from 8 clients per GOMAXPROCS, and reports req/s and p99.
func benchServe(b *testing.B, h http.Handler) {
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	prefix := storetest.UniqueName("b")
	var seq atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism(8)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			i := seq.Add(1)
			order := fmt.Sprintf("%s-%d", prefix, i)
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders?o="+order, strings.NewReader(`{"amount":10}`))
			req.Header.Set(HeaderKey, `"`+order+`"`)
			t0 := time.Now()
			res, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			mine = append(mine, time.Since(t0))
			if res.StatusCode != http.StatusCreated {
				b.Errorf("status %d", res.StatusCode)
				return
			}
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(0, "ns/op")
}
