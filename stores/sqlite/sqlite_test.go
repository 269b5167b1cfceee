package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/stores/sqlite"
	"github.com/idemq/idemq/stores/storetest"
)

// effects is the business table the conformance suite's handlers write to.
const effectsDDL = `CREATE TABLE IF NOT EXISTS effects (k TEXT NOT NULL)`

func TestConformance(t *testing.T) {
	conformance(t, true, func(s *sqlite.Store) driver.Store[*sql.Tx] { return s })
}

// bareStore is a store with only what driver.Store requires: it hides the
// sqlite store's Prune and Migrate, which core treats as optional.
type bareStore struct{ s *sqlite.Store }

func (b bareStore) Begin(ctx context.Context) (driver.Txn[*sql.Tx], error) { return b.s.Begin(ctx) }
func (b bareStore) Close() error                                           { return b.s.Close() }
func (b bareStore) As(target any) bool                                     { return b.s.As(target) }

// TestConformanceWithoutOptionalInterfaces: a store that implements
// neither admin.Pruner nor admin.Migrator runs the suite; the cases that
// need them are skipped, the rest must pass.
func TestConformanceWithoutOptionalInterfaces(t *testing.T) {
	conformance(t, false, func(s *sqlite.Store) driver.Store[*sql.Tx] {
		var st driver.Store[*sql.Tx] = bareStore{s}
		if _, ok := st.(admin.Pruner); ok {
			t.Fatal("bareStore implements admin.Pruner")
		}
		if _, ok := st.(admin.Migrator); ok {
			t.Fatal("bareStore implements admin.Migrator")
		}
		return st
	})
}

// conformance runs storetest on sqlite stores that wrap turns into the
// store under test; leaser says that store leases.
func conformance(t *testing.T, leaser bool, wrap func(*sqlite.Store) driver.Store[*sql.Tx]) {
	// One database file for all subtests, as a service would have: each
	// subtest uses its own dedup table, all share the effects table.
	path := filepath.Join(t.TempDir(), "conformance.db")
	ctx := context.Background()
	base, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { base.Close() })
	if _, err := base.DB().ExecContext(ctx, effectsDDL); err != nil {
		t.Fatal(err)
	}
	storetest.Run(t, storetest.Harness[*sql.Tx]{
		Open: func(t *testing.T, cfg storetest.Config) (driver.Store[*sql.Tx], error) {
			s, err := sqlite.Open(ctx, path, sqlite.WithTable(cfg.Table), sqlite.WithClock(cfg.Now))
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() {
				_, _ = s.DB().Exec(`DROP TABLE IF EXISTS ` + cfg.Table)
				_, _ = s.DB().Exec(`DROP TABLE IF EXISTS ` + cfg.Table + `_leases`)
				s.Close()
			})
			return wrap(s), nil
		},
		Leaser: leaser,
		DropLeaseTable: func(t *testing.T, table string) {
			if _, err := base.DB().Exec(`DROP TABLE ` + table + `_leases`); err != nil {
				t.Fatal(err)
			}
		},
		Effect: func(ctx context.Context, tx *sql.Tx, key string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effects (k) VALUES (?)`, key)
			return err
		},
		Fail: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `SELECT * FROM idemq_no_such_table`)
			return err
		},
		CountEffects: func(t *testing.T, key string) int {
			var n int
			if err := base.DB().QueryRow(`SELECT count(*) FROM effects WHERE k = ?`, key).Scan(&n); err != nil {
				t.Fatalf("count effects: %v", err)
			}
			return n
		},
	})
}

func TestOptionErrorsNameTheOption(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	cases := map[string]sqlite.Option{
		"WithTable":       sqlite.WithTable("a-b"),
		"WithRetention":   sqlite.WithRetention(0),
		"WithClock":       sqlite.WithClock(nil),
		"WithBusyTimeout": sqlite.WithBusyTimeout(-time.Second),
	}
	for name, opt := range cases {
		_, err := sqlite.Open(ctx, filepath.Join(dir, "x.db"), opt)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %v does not name the option", name, err)
		}
		if _, err := sqlite.New(&sql.DB{}, opt); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("New %s: error %v does not name the option", name, err)
		}
	}
	if _, err := sqlite.Open(ctx, ":memory:"); err == nil {
		t.Error(":memory: accepted")
	}
	if _, err := sqlite.Open(ctx, filepath.Join(dir, "a?b.db")); err == nil {
		t.Error("path with '?' accepted")
	}
}

func TestDefaults(t *testing.T) {
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "d.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Retention() != 7*24*time.Hour {
		t.Errorf("default retention %v, want 7 days", s.Retention())
	}
	if s.Table() != "processed_messages" {
		t.Errorf("default table %q", s.Table())
	}
	var mode string
	if err := s.DB().QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode %q, %v; want wal", mode, err)
	}
}

// TestNewRequiresMigrate checks that New leaves migration to the caller and
// that Migrate then makes the store usable.
func TestNewRequiresMigrate(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "n.db")+"?_txlock=immediate&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := sqlite.New(db, sqlite.WithTable("inbox"))
	if err != nil {
		t.Fatal(err)
	}
	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "a"}}); err == nil {
		t.Fatal("claim on an unmigrated table succeeded")
	}
	txn.Rollback(ctx)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	txn, err = s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "a"}})
	if err != nil || res[0] != driver.ClaimWon {
		t.Fatalf("claim after migrate: %v %v", res, err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Close leaves a handle given to New open.
	if err := db.Ping(); err != nil {
		t.Fatalf("New's db closed by Store.Close: %v", err)
	}
}

// TestManyClaimersOneEffect runs several goroutines claiming the same ids
// with their own transactions: every id's effect is committed exactly once
// and no claimer fails with SQLITE_BUSY.
func TestManyClaimersOneEffect(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "m.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.DB().Exec(effectsDDL); err != nil {
		t.Fatal(err)
	}
	const workers, ids = 4, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < ids; i++ {
				id := string(rune('A'+i%26)) + strings.Repeat("x", i/26)
				txn, err := s.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: id}})
				if err == nil && res[0] == driver.ClaimWon {
					_, err = txn.Tx().ExecContext(ctx, `INSERT INTO effects (k) VALUES (?)`, id)
				}
				if err == nil {
					err = txn.Commit(ctx)
				}
				if err != nil {
					txn.Rollback(ctx)
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("claimer: %v", err)
	}
	var total, distinct int
	if err := s.DB().QueryRow(`SELECT count(*), count(DISTINCT k) FROM effects`).Scan(&total, &distinct); err != nil {
		t.Fatal(err)
	}
	if total != ids || distinct != ids {
		t.Fatalf("effects: %d rows, %d distinct; want %d each", total, distinct, ids)
	}
}

func TestRunPruner(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewClock(time.Now().Add(-2 * time.Hour))
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "p.db"), sqlite.WithClock(clock.Now), sqlite.WithRetention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]driver.Claim, 25)
	for i := range ids {
		ids[i] = driver.Claim{ID: "old" + string(rune('a'+i))}
	}
	if _, err := txn.Claim(ctx, "c", ids); err != nil {
		t.Fatal(err)
	}
	clock.Set(time.Now())
	if _, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "fresh"}}); err != nil {
		t.Fatal(err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.RunPruner(ctx, 0, 10, nil); err == nil {
		t.Fatal("RunPruner with a zero interval must fail")
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.RunPruner(pctx, 20*time.Millisecond, 10, nil) }()
	deadline := time.Now().Add(10 * time.Second)
	var n int
	for time.Now().Before(deadline) {
		s.DB().QueryRow(`SELECT count(*) FROM processed_messages`).Scan(&n)
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
	s.DB().QueryRow(`SELECT group_concat(message_id) FROM processed_messages`).Scan(&left)
	if left != "fresh" {
		t.Fatalf("rows left after pruning: %q, want only fresh", left)
	}
}

// TestBusyIsTransient: a Begin that waits longer than busy_timeout for
// another transaction's write lock fails with SQLITE_BUSY, which is
// transient; after the holder commits, the retry sees its claim.
func TestBusyIsTransient(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "b.db"), sqlite.WithBusyTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	holder, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Claim(ctx, "c", []driver.Claim{{ID: "m"}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = s.Begin(ctx)
	if err == nil {
		t.Fatal("second Begin got the write lock while the first transaction held it")
	}
	if waited := time.Since(start); waited < 80*time.Millisecond {
		t.Fatalf("second Begin failed after %v without waiting busy_timeout", waited)
	}
	if !sqlite.IsTransient(err) {
		t.Fatalf("SQLITE_BUSY not transient: %v", err)
	}
	if sqlite.IsTransient(errors.New("other")) || sqlite.IsTransient(nil) {
		t.Fatal("IsTransient true for a plain error or nil")
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	retry, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer retry.Rollback(ctx)
	res, err := retry.Claim(ctx, "c", []driver.Claim{{ID: "m"}})
	if err != nil || res[0] != driver.ClaimDuplicate {
		t.Fatalf("retry: %v %v; want duplicate", res, err)
	}
}
