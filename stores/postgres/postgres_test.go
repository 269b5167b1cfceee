package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/storetest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// postgresURL returns the test server's URL from IDEMQ_POSTGRES_URL (default:
// the local server). An unreachable server skips the test, or fails it when
// IDEMQ_REQUIRE_SERVICES=1.
func postgresURL(t testing.TB) string {
	t.Helper()
	return servicetest.PostgresURL(t)
}

// testPool opens a pool shared by one test's stores, closed at cleanup.
func testPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), postgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// effectsTable creates a business table unique to the test, dropped at
// cleanup.
func effectsTable(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := storetest.UniqueName("idemq_fx_")
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+name+` (k TEXT NOT NULL, n INT NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+name) })
	return name
}

// openStore opens a migrated store on a fresh table of pool, dropped at
// cleanup.
func openStore(t testing.TB, pool *pgxpool.Pool, opts ...postgres.Option) *postgres.Store {
	t.Helper()
	table := storetest.UniqueName("idemq_pm_")
	s, err := postgres.New(pool, append([]postgres.Option{postgres.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+table+`, `+table+`_leases`) })
	return s
}

func TestConformance(t *testing.T) {
	pool := testPool(t)
	fx := effectsTable(t, pool)
	storetest.Run(t, storetest.Harness[pgx.Tx]{
		Open: func(t *testing.T, cfg storetest.Config) (driver.Store[pgx.Tx], error) {
			s, err := postgres.New(pool, postgres.WithTable(cfg.Table), postgres.WithClock(cfg.Now))
			if err != nil {
				return nil, err
			}
			if err := s.Migrate(context.Background()); err != nil {
				return nil, err
			}
			t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+cfg.Table+`, `+cfg.Table+`_leases`) })
			return s, nil
		},
		Leaser:         true,
		DropLeaseTable: func(t *testing.T, table string) { dropLeaseTable(t, pool, table) },
		Effect: func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+fx+` (k) VALUES ($1)`, key)
			return err
		},
		Retryable: postgres.IsTransient,
		Fail: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT 1/0`)
			return err
		},
		CountEffects: func(t *testing.T, key string) int {
			var n int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+fx+` WHERE k = $1`, key).Scan(&n); err != nil {
				t.Fatalf("count effects: %v", err)
			}
			return n
		},
	})
}

// TestOpen covers the URL constructor: it migrates, and Close closes the
// pool it made.
func TestOpen(t *testing.T) {
	url := postgresURL(t)
	ctx := context.Background()
	table := storetest.UniqueName("idemq_open_")
	s, err := postgres.Open(ctx, url, postgres.WithTable(table), postgres.WithRetention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Pool().Exec(ctx, `DROP TABLE IF EXISTS `+table+`, `+table+`_leases`)
	if s.Retention() != time.Hour || s.Table() != table {
		t.Fatalf("retention %v table %q", s.Retention(), s.Table())
	}
	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "a"}})
	if err != nil || res[0] != driver.ClaimWon {
		t.Fatalf("claim: %v %v", res, err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.Open(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"); err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
}

func TestOptionErrorsNameTheOption(t *testing.T) {
	cases := map[string]postgres.Option{
		"WithTable":     postgres.WithTable("x; DROP TABLE y"),
		"WithRetention": postgres.WithRetention(-time.Hour),
		"WithClock":     postgres.WithClock(nil),
	}
	for name, opt := range cases {
		// The option is checked before any connection is made.
		_, err := postgres.Open(context.Background(), "postgres://127.0.0.1:1/x", opt)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %v does not name the option", name, err)
		}
	}
	if _, err := postgres.New(nil); err == nil {
		t.Error("New(nil) accepted")
	}
}

// TestConcurrentMigrate runs Migrate from several pools at once on a new
// table, as several processes starting together would.
func TestConcurrentMigrate(t *testing.T) {
	url := postgresURL(t)
	ctx := context.Background()
	table := storetest.UniqueName("idemq_mig_")
	const procs = 4
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for i := 0; i < procs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := postgres.Open(ctx, url, postgres.WithTable(table))
			if err != nil {
				errs <- err
				return
			}
			s.Close()
		}()
	}
	wg.Wait()
	close(errs)
	pool := testPool(t)
	defer pool.Exec(ctx, `DROP TABLE IF EXISTS `+table+`, `+table+`_leases`)
	for err := range errs {
		t.Errorf("concurrent migrate: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE tablename = $1`, table).Scan(&n); err != nil || n != 2 {
		t.Fatalf("indexes on %s: %d, %v; want primary key + processed_at", table, n, err)
	}
}

// TestKilledConnection terminates the backend of a transaction that has
// claimed an id and applied its effect: the next statement, or the commit,
// fails with a transient error, and the claim and effect are gone with the
// transaction.
func TestKilledConnection(t *testing.T) {
	for _, next := range []string{"claim", "commit"} {
		t.Run(next, func(t *testing.T) {
			pool := testPool(t)
			s := openStore(t, pool)
			fx := effectsTable(t, pool)
			ctx := context.Background()
			txn, err := s.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer txn.Rollback(ctx)
			if res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "victim"}}); err != nil || res[0] != driver.ClaimWon {
				t.Fatalf("claim: %v %v", res, err)
			}
			if _, err := txn.Tx().Exec(ctx, `INSERT INTO `+fx+` (k) VALUES ('victim')`); err != nil {
				t.Fatal(err)
			}
			var pid int32
			if err := txn.Tx().QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			var ok bool
			if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
				t.Fatalf("terminate backend %d: %v %v", pid, ok, err)
			}
			if next == "claim" {
				_, err = txn.Claim(ctx, "c", []driver.Claim{{ID: "after-kill"}})
			} else {
				err = txn.Commit(ctx)
			}
			if err == nil {
				t.Fatalf("%s on a terminated backend succeeded", next)
			}
			if !postgres.IsTransient(err) {
				t.Fatalf("error after pg_terminate_backend is not transient: %v", err)
			}
			t.Logf("%s after kill (transient): %v", next, err)
			if err := txn.Rollback(ctx); err != nil {
				t.Fatalf("rollback of a transaction whose connection died: %v", err)
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+fx).Scan(&n); err != nil || n != 0 {
				t.Fatalf("effects after the kill: %d, %v; want 0", n, err)
			}
			txn2, err := s.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer txn2.Rollback(ctx)
			res, err := txn2.Claim(ctx, "c", []driver.Claim{{ID: "victim"}})
			if err != nil || res[0] != driver.ClaimWon {
				t.Fatalf("claim after the killed transaction: %v %v; want won (claim must not be left behind)", res, err)
			}
		})
	}
}

// TestLockTimeoutIsTransient: a claimer waiting on an id another
// transaction holds gives up with lock_timeout (55P03), classified
// transient, and a retry after the holder rolls back wins.
func TestLockTimeoutIsTransient(t *testing.T) {
	pool := testPool(t)
	s := openStore(t, pool)
	ctx := context.Background()
	holder, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Claim(ctx, "c", []driver.Claim{{ID: "held"}}); err != nil {
		t.Fatal(err)
	}
	waiter, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Rollback(ctx)
	if _, err := waiter.Tx().Exec(ctx, `SET LOCAL lock_timeout = '200ms'`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = waiter.Claim(ctx, "c", []driver.Claim{{ID: "held"}})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("claim of a held id with lock_timeout: %v; want 55P03", err)
	}
	if waited := time.Since(start); waited < 150*time.Millisecond {
		t.Fatalf("claim failed after %v without waiting for the lock", waited)
	}
	if !postgres.IsTransient(err) {
		t.Fatalf("lock timeout not transient: %v", err)
	}
	waiter.Rollback(ctx)
	holder.Rollback(ctx)
	retry, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer retry.Rollback(ctx)
	if res, err := retry.Claim(ctx, "c", []driver.Claim{{ID: "held"}}); err != nil || res[0] != driver.ClaimWon {
		t.Fatalf("retry: %v %v", res, err)
	}
}

// TestDeadlockIsTransient makes two transactions wait on each other's
// claims: Postgres aborts one with 40P01, which is transient; its retry
// then sees the other's committed claim and applies no effect, so each
// effect is committed once.
func TestDeadlockIsTransient(t *testing.T) {
	pool := testPool(t)
	s := openStore(t, pool)
	fx := effectsTable(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	a, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Rollback(ctx)
	b, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Rollback(ctx)
	// Separate Claim calls (a batch would be sorted and could not
	// deadlock): a holds x, b holds y, then each wants the other's.
	mustClaim := func(txn driver.Txn[pgx.Tx], id string) {
		if res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: id}}); err != nil || res[0] != driver.ClaimWon {
			t.Fatalf("claim %s: %v %v", id, res, err)
		}
		if _, err := txn.Tx().Exec(ctx, `INSERT INTO `+fx+` (k) VALUES ($1)`, id); err != nil {
			t.Fatal(err)
		}
	}
	mustClaim(a, "x")
	mustClaim(b, "y")
	// The second claim of each, then its effect: the winner applies both.
	second := func(txn driver.Txn[pgx.Tx], id string) error {
		if _, err := txn.Claim(ctx, "c", []driver.Claim{{ID: id}}); err != nil {
			return err
		}
		_, err := txn.Tx().Exec(ctx, `INSERT INTO `+fx+` (k) VALUES ($1)`, id)
		return err
	}
	errA := make(chan error, 1)
	go func() { errA <- second(a, "y") }()
	time.Sleep(100 * time.Millisecond) // let a block on y first
	errB := second(b, "x")
	var loser, winner driver.Txn[pgx.Tx]
	var lossErr error
	if errB != nil {
		loser, winner, lossErr = b, a, errB
		if err := <-errA; err != nil {
			t.Fatalf("both failed: %v / %v", err, errB)
		}
	} else {
		loser, winner, lossErr = a, b, <-errA
	}
	var pgErr *pgconn.PgError
	if !errors.As(lossErr, &pgErr) || pgErr.Code != "40P01" {
		t.Fatalf("want a deadlock (40P01), got %v", lossErr)
	}
	if !postgres.IsTransient(lossErr) {
		t.Fatalf("deadlock not transient: %v", lossErr)
	}
	loser.Rollback(ctx)
	if err := winner.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The loser's retry finds both ids claimed by the winner, whose effects
	// are the only ones committed.
	retry, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer retry.Rollback(ctx)
	res, err := retry.Claim(ctx, "c", []driver.Claim{{ID: "x"}, {ID: "y"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"x", "y"} {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+fx+` WHERE k = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if res[i] != driver.ClaimDuplicate || n != 1 {
			t.Fatalf("id %s: retry %v with %d effects; want duplicate with 1", id, res[i], n)
		}
	}
}

func TestRunPruner(t *testing.T) {
	pool := testPool(t)
	clock := storetest.NewClock(time.Now().Add(-2 * time.Hour))
	s := openStore(t, pool, postgres.WithClock(clock.Now), postgres.WithRetention(time.Hour))
	ctx := context.Background()
	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]driver.Claim, 25)
	for i := range ids {
		ids[i] = driver.Claim{ID: fmt.Sprint("old", i)}
	}
	txn.Claim(ctx, "c", ids)
	clock.Set(time.Now())
	txn.Claim(ctx, "c", []driver.Claim{{ID: "fresh"}})
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.RunPruner(pctx, 20*time.Millisecond, 10, nil) }()
	deadline := time.Now().Add(10 * time.Second)
	var n int
	for time.Now().Before(deadline) {
		pool.QueryRow(ctx, `SELECT count(*) FROM `+s.Table()).Scan(&n)
		if n == 1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunPruner returned %v, want context.Canceled", err)
	}
	var left string
	pool.QueryRow(ctx, `SELECT string_agg(message_id, ',') FROM `+s.Table()).Scan(&left)
	if left != "fresh" {
		t.Fatalf("rows left after pruning: %q, want only fresh", left)
	}
}

// TestIsTransientRejects: errors that a retry cannot cure are not
// transient (a missing table, bad SQL, a business constraint).
func TestIsTransientRejects(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	for _, q := range []string{
		`SELECT * FROM idemq_no_such_table`,
		`SELEC 1`,
		`SELECT 1/0`,
	} {
		_, err := pool.Exec(ctx, q)
		if err == nil {
			t.Fatalf("%s succeeded", q)
		}
		if postgres.IsTransient(err) {
			t.Errorf("%s: %v classified transient", q, err)
		}
	}
	if postgres.IsTransient(nil) {
		t.Error("nil is transient")
	}
	if !postgres.IsTransient(context.DeadlineExceeded) {
		t.Error("deadline not transient")
	}
}

// dropLeaseTable drops the lease table of the dedup table named table.
func dropLeaseTable(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `DROP TABLE `+table+`_leases`); err != nil {
		t.Fatal(err)
	}
}
