package idempotency

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/mysql"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/sqlite"
	"github.com/idemq/idemq/stores/storetest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// execFunc runs one statement in the handler's transaction, whatever the
// store.
type execFunc func(q string, args ...any) error

// bizFunc is a test handler, written once for every store.
type bizFunc func(w http.ResponseWriter, r *http.Request, ex execFunc) error

// fixture is one store, its middleware and a business table fx whose rows
// are the effects.
type fixture struct {
	backend        string
	names          names
	handler        func(bizFunc) http.Handler
	wrap           func(http.Handler) http.Handler // the middleware's Wrap
	wrapped        func(bizFunc) http.Handler      // a bizFunc as next of Wrap, its transaction from TxFromContext
	insert         string                          // INSERT INTO fx (k) VALUES (…), one placeholder
	count          func(k string) int
	leaser         driver.Leaser
	begin          func(ctx context.Context) (fencer, error)
	prune          func(ctx context.Context, before time.Time, limit int) (int, error)
	pruneClaims    func(ctx context.Context, before time.Time, limit int) (int, error)
	setAfterCommit func(func())
	newWith        func(opts ...Option) (any, error) // New on the fixture's store
	pool           *pgxpool.Pool                     // Postgres only
}

// fencer is a store transaction seen by a lease holder of the tests.
type fencer interface {
	driver.Fencer
	Rollback(ctx context.Context) error
}

// names are the tables of one fixture, shared with a child process.
type names struct {
	Claims, Responses, Effects, SQLitePath string
}

func newNames(t testing.TB) names {
	return names{Claims: storetest.UniqueName("idemq_hc_"), Responses: storetest.UniqueName("idemq_hr_"), Effects: storetest.UniqueName("idemq_hfx_"),
		SQLitePath: filepath.Join(t.TempDir(), "http.db")}
}

var backends = []string{"postgres", "mysql", "sqlite"}

// open builds the fixture of backend over the tables n; cleanup drops
// them when drop is set.
func open(t testing.TB, backend string, n names, drop bool, opts ...Option) *fixture {
	t.Helper()
	ctx := context.Background()
	opts = append([]Option{WithTable(n.Responses), WithScope(testScope)}, opts...)
	switch backend {
	case "postgres":
		s, err := postgres.Open(ctx, servicetest.PostgresURL(t), postgres.WithTable(n.Claims))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		pool := s.Pool()
		if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+n.Effects+` (k TEXT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		if drop {
			t.Cleanup(func() {
				pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+n.Effects+`, `+n.Claims+`, `+n.Claims+`_leases, `+n.Responses)
			})
		}
		f := build(t, s, func(tx pgx.Tx, q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err }, opts)
		f.insert = `INSERT INTO ` + n.Effects + ` (k) VALUES ($1)`
		f.count = func(k string) int {
			var c int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+n.Effects+` WHERE k = $1`, k).Scan(&c); err != nil {
				t.Fatal(err)
			}
			return c
		}
		f.begin = func(ctx context.Context) (fencer, error) { txn, err := s.Begin(ctx); return txn.(*postgres.Txn), err }
		f.pruneClaims = s.Prune
		f.backend, f.names, f.pool = backend, n, pool
		return f
	case "mysql", "sqlite":
		var s sqlStore
		var err error
		if backend == "mysql" {
			s, err = mysql.Open(ctx, servicetest.MySQLURL(t), mysql.WithTable(n.Claims))
		} else {
			s, err = sqlite.Open(ctx, n.SQLitePath, sqlite.WithTable(n.Claims))
		}
		if err != nil {
			t.Fatal(err)
		}
		return openSQL(t, backend, s, n, drop, opts)
	}
	t.Fatalf("unknown backend %q", backend)
	return nil
}

// sqlStore is the MySQL or SQLite store of a fixture.
type sqlStore interface {
	driver.Store[*sql.Tx]
	Prune(context.Context, time.Time, int) (int, error)
}

// openSQL builds the fixture of backend, mysql or sqlite, over its store
// s, which it closes at cleanup.
func openSQL(t testing.TB, backend string, s sqlStore, n names, drop bool, opts []Option) *fixture {
	t.Helper()
	ctx := context.Background()
	effects := `CREATE TABLE IF NOT EXISTS ` + n.Effects + ` (k TEXT NOT NULL)`
	if backend == "mysql" {
		effects = `CREATE TABLE IF NOT EXISTS ` + n.Effects + ` (k VARBINARY(255) NOT NULL)`
	}
	t.Cleanup(func() { s.Close() })
	var db *sql.DB
	s.As(&db)
	if _, err := db.Exec(effects); err != nil {
		t.Fatal(err)
	}
	if drop && backend == "mysql" {
		t.Cleanup(func() {
			db.Exec(`DROP TABLE IF EXISTS ` + n.Effects + `, ` + n.Claims + `, ` + n.Claims + `_leases, ` + n.Responses)
		})
	}
	f := build(t, s, func(tx *sql.Tx, q string, args ...any) error { _, err := tx.ExecContext(ctx, q, args...); return err }, opts)
	f.insert = `INSERT INTO ` + n.Effects + ` (k) VALUES (?)`
	f.count = func(k string) int {
		var c int
		if err := db.QueryRow(`SELECT count(*) FROM `+n.Effects+` WHERE k = ?`, k).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	f.begin = func(ctx context.Context) (fencer, error) { txn, err := s.Begin(ctx); return txn.(fencer), err }
	f.pruneClaims = s.Prune
	f.backend, f.names = backend, n
	return f
}

// build makes the middleware over s and runs its Migrate.
func build[Tx any](t testing.TB, s driver.Store[Tx], run func(tx Tx, q string, args ...any) error, opts []Option) *fixture {
	t.Helper()
	m, err := New(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &fixture{
		handler: func(b bizFunc) http.Handler {
			return m.Handler(func(w http.ResponseWriter, r *http.Request, tx Tx) error {
				return b(w, r, func(q string, args ...any) error { return run(tx, q, args...) })
			})
		},
		wrap: m.Wrap,
		wrapped: func(b bizFunc) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tx, ok := TxFromContext[Tx](r.Context())
				if !ok {
					http.Error(w, "no transaction in the request's context", http.StatusInternalServerError)
					return
				}
				if err := b(w, r, func(q string, args ...any) error { return run(tx, q, args...) }); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
			})
		},
		leaser:         s.(driver.Leaser),
		prune:          m.Prune,
		setAfterCommit: func(f func()) { m.afterCommit = f },
		newWith:        func(opts ...Option) (any, error) { return New(s, opts...) },
	}
}

// each runs test once per backend, each with fresh tables.
func each(t *testing.T, test func(t *testing.T, f *fixture), opts ...Option) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) { test(t, open(t, b, newNames(t), true, opts...)) })
	}
}

// orders is the handler most tests use: it inserts the effect named by
// the body's "order" and answers 201 with a JSON body naming it.
func (f *fixture) orders() bizFunc {
	return func(w http.ResponseWriter, r *http.Request, ex execFunc) error {
		var in struct{ Order string }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			return err
		}
		if err := ex(f.insert, in.Order); err != nil {
			return err
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+in.Order)
		w.Header().Set("Set-Cookie", "session=not-stored")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q,"at":%q}`, in.Order, time.Now().Format(time.RFC3339Nano))
		return nil
	}
}

// answer is a response read whole.
type answer struct {
	status int
	header http.Header
	body   string
}

// post sends body to url with key as the Idempotency-Key value (none when
// key is empty).
func post(t testing.TB, url, key, body string) answer {
	t.Helper()
	a, err := tryPost(url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func tryPost(url, key, body string) (answer, error) { return tryPostAs(url, "", key, body) }

// tryPostAs is tryPost for a request of tenant (tenantHeader), none when
// tenant is empty.
func tryPostAs(url, tenant, key, body string) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	if key != "" {
		req.Header.Set(HeaderKey, key)
	}
	if tenant != "" {
		req.Header.Set(tenantHeader, tenant)
	}
	// net/http's client resends a request carrying an Idempotency-Key
	// whose connection broke; the tests do their retries themselves.
	req.GetBody = nil
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, header: res.Header, body: string(b)}, err
}

// serve starts a loopback server for h.
func serve(t testing.TB, h http.Handler) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/orders", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/orders"
}

// problemOf decodes a problem answer and checks its status member and
// media type.
func problemOf(t testing.TB, a answer, status int) problem {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d (%s)", a.status, status, a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p problem
	if err := json.Unmarshal([]byte(a.body), &p); err != nil {
		t.Fatal(err)
	}
	if p.Status != status || p.Type == "" || p.Title == "" {
		t.Fatalf("problem %+v", p)
	}
	return p
}

// testScope is the tests' scope: the tenant (tenantHeader, which stands
// for what authentication finds), the method and the path.
func testScope(r *http.Request) string {
	return r.Header.Get(tenantHeader) + " " + r.Method + " " + r.URL.Path
}

// ordersID is the id the middleware claims for key in a POST to /orders
// without a tenant.
func ordersID(key string) string {
	return claimID(testScope(httptest.NewRequest(http.MethodPost, "/orders", nil)), key)
}
