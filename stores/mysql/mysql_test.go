package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/mysql"
	"github.com/idemq/idemq/stores/storetest"

	mysqldrv "github.com/go-sql-driver/mysql"
)

// mysqlDSN returns the test server's DSN from IDEMQ_MYSQL_URL (default: the
// local MariaDB). An unreachable server skips the test, or fails it when
// IDEMQ_REQUIRE_SERVICES=1.
func mysqlDSN(t testing.TB) string {
	t.Helper()
	return servicetest.MySQLURL(t)
}

// storeURL returns the local server as a mysql:// URL (timeout=5s), as
// core.OpenStore takes it, whatever form IDEMQ_MYSQL_URL is written in.
func storeURL(t testing.TB) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(mysqlDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	return "mysql://" + cfg.User + ":" + cfg.Passwd + "@" + cfg.Addr + "/" + cfg.DBName + "?timeout=5s"
}

// testDB opens a handle like Open's (interpolateParams on), closed at
// cleanup.
func testDB(t testing.TB) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(mysqlDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.InterpolateParams = true
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

// effectsTable creates a business table unique to the test, dropped at
// cleanup. Keys are VARBINARY so they compare byte for byte, like ids.
func effectsTable(t testing.TB, db *sql.DB) string {
	t.Helper()
	name := storetest.UniqueName("idemq_fx_")
	if _, err := db.Exec(`CREATE TABLE ` + name + ` (k VARBINARY(2048) NOT NULL, n INT NOT NULL DEFAULT 0, KEY (k(255)))`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec(`DROP TABLE IF EXISTS ` + name) })
	return name
}

func openStore(t testing.TB, db *sql.DB, opts ...mysql.Option) *mysql.Store {
	t.Helper()
	table := storetest.UniqueName("idemq_my_")
	s, err := mysql.New(db, append([]mysql.Option{mysql.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec(`DROP TABLE IF EXISTS ` + table + `, ` + table + `_leases`) })
	return s
}

func TestConformance(t *testing.T) {
	variants := map[string][]mysql.Option{
		"auto":                   {mysql.WithClaimMode(mysql.ClaimAuto)},
		"readback":               {mysql.WithClaimMode(mysql.ClaimReadBack)},
		"readback-readcommitted": {mysql.WithClaimMode(mysql.ClaimReadBack), mysql.WithIsolation(sql.LevelReadCommitted)},
		"auto-serializable":      {mysql.WithIsolation(sql.LevelSerializable)},
	}
	for name, opts := range variants {
		t.Run(name, func(t *testing.T) {
			db := testDB(t)
			fx := effectsTable(t, db)
			storetest.Run(t, storetest.Harness[*sql.Tx]{
				Open: func(t *testing.T, cfg storetest.Config) (driver.Store[*sql.Tx], error) {
					s, err := mysql.New(db, append([]mysql.Option{mysql.WithTable(cfg.Table), mysql.WithClock(cfg.Now)}, opts...)...)
					if err != nil {
						return nil, err
					}
					if err := s.Migrate(context.Background()); err != nil {
						return nil, err
					}
					t.Cleanup(func() { db.Exec(`DROP TABLE IF EXISTS ` + cfg.Table + `, ` + cfg.Table + `_leases`) })
					return s, nil
				},
				Leaser: true,
				DropLeaseTable: func(t *testing.T, table string) {
					if _, err := db.Exec(`DROP TABLE ` + table + `_leases`); err != nil {
						t.Fatal(err)
					}
				},
				Effect: func(ctx context.Context, tx *sql.Tx, key string) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO `+fx+` (k) VALUES (?)`, key)
					return err
				},
				Retryable: mysql.IsTransient,
				Fail: func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `SELECT * FROM idemq_no_such_table`)
					return err
				},
				CountEffects: func(t *testing.T, key string) int {
					var n int
					if err := db.QueryRow(`SELECT count(*) FROM `+fx+` WHERE k = ?`, key).Scan(&n); err != nil {
						t.Fatalf("count effects: %v", err)
					}
					return n
				},
			})
		})
	}
}

// TestOpen covers the DSN and URL constructor: both forms connect and
// migrate.
func TestOpen(t *testing.T) {
	ctx := context.Background()
	for _, d := range []string{mysqlDSN(t), storeURL(t)} {
		table := storetest.UniqueName("idemq_open_")
		s, err := mysql.Open(ctx, d, mysql.WithTable(table), mysql.WithRetention(time.Hour))
		if err != nil {
			t.Fatalf("Open(%q): %v", d, err)
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
		if s.Retention() != time.Hour {
			t.Fatalf("retention %v", s.Retention())
		}
		s.DB().Exec(`DROP TABLE ` + table + `, ` + table + `_leases`)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := mysql.Open(ctx, "root:@tcp(127.0.0.1:1)/none?timeout=1s"); err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
}

func TestOptionErrorsNameTheOption(t *testing.T) {
	cases := map[string]mysql.Option{
		"WithTable":     mysql.WithTable("a`b"),
		"WithRetention": mysql.WithRetention(0),
		"WithClock":     mysql.WithClock(nil),
		"WithClaimMode": mysql.WithClaimMode(42),
		"WithIsolation": mysql.WithIsolation(sql.LevelReadUncommitted),
		"WithLogger":    mysql.WithLogger(nil),
	}
	for name, opt := range cases {
		_, err := mysql.Open(context.Background(), "root:@tcp(127.0.0.1:1)/x", opt)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %v does not name the option", name, err)
		}
	}
	if _, err := mysql.New(nil); err == nil {
		t.Error("New(nil) accepted")
	}
}

// TestLimits: ids, consumers and fingerprints too long for their columns
// are refused before reaching a server that might truncate them.
func TestLimits(t *testing.T) {
	db := testDB(t)
	s := openStore(t, db)
	ctx := context.Background()
	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Rollback(ctx)
	if _, err := txn.Claim(ctx, "c", []driver.Claim{{ID: strings.Repeat("x", mysql.MaxIDBytes+1)}}); !errors.Is(err, core.ErrInvalidID) {
		t.Errorf("over-long id: %v, want ErrInvalidID", err)
	}
	if _, err := txn.Claim(ctx, strings.Repeat("c", mysql.MaxConsumerBytes+1), []driver.Claim{{ID: "a"}}); err == nil {
		t.Error("over-long consumer accepted")
	}
	if _, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "a", Fingerprint: strings.Repeat("f", 129)}}); err == nil {
		t.Error("over-long fingerprint accepted")
	}
	res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: strings.Repeat("🙂", mysql.MaxIDBytes/4)}})
	if err != nil || res[0] != driver.ClaimWon {
		t.Fatalf("id of exactly %d bytes: %v %v", mysql.MaxIDBytes, res, err)
	}
}

func TestConcurrentMigrate(t *testing.T) {
	dsn := mysqlDSN(t)
	ctx := context.Background()
	table := storetest.UniqueName("idemq_mig_")
	db := testDB(t)
	defer db.Exec(`DROP TABLE IF EXISTS ` + table + `, ` + table + `_leases`)
	const procs = 4
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for i := 0; i < procs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := mysql.Open(ctx, dsn, mysql.WithTable(table))
			if err != nil {
				errs <- err
				return
			}
			s.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent migrate: %v", err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(DISTINCT index_name) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ?`, table).Scan(&n); err != nil || n != 2 {
		t.Fatalf("indexes on %s: %d, %v; want primary key + processed_at", table, n, err)
	}
}

// TestKilledConnection kills the session of a transaction that has claimed
// an id and applied its effect: the next statement, or the commit, fails
// with a transient error, and the claim and effect are gone.
func TestKilledConnection(t *testing.T) {
	for _, next := range []string{"claim", "commit"} {
		t.Run(next, func(t *testing.T) {
			db := testDB(t)
			s := openStore(t, db)
			fx := effectsTable(t, db)
			ctx := context.Background()
			txn, err := s.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer txn.Rollback(ctx)
			if res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "victim"}}); err != nil || res[0] != driver.ClaimWon {
				t.Fatalf("claim: %v %v", res, err)
			}
			if _, err := txn.Tx().Exec(`INSERT INTO ` + fx + ` (k) VALUES ('victim')`); err != nil {
				t.Fatal(err)
			}
			var id int64
			if err := txn.Tx().QueryRow(`SELECT CONNECTION_ID()`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(`KILL ` + strconv.FormatInt(id, 10)); err != nil {
				t.Fatalf("KILL %d: %v", id, err)
			}
			if next == "claim" {
				_, err = txn.Claim(ctx, "c", []driver.Claim{{ID: "after-kill"}})
			} else {
				err = txn.Commit(ctx)
			}
			if err == nil {
				t.Fatalf("%s on a killed connection succeeded", next)
			}
			if !mysql.IsTransient(err) {
				t.Fatalf("error after KILL is not transient: %v", err)
			}
			t.Logf("%s after kill (transient): %v", next, err)
			if err := txn.Rollback(ctx); err != nil {
				t.Fatalf("rollback of a transaction whose connection died: %v", err)
			}
			var n int
			if err := db.QueryRow(`SELECT count(*) FROM ` + fx).Scan(&n); err != nil || n != 0 {
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

// TestLockWaitTimeoutIsTransient: a claimer waiting on an id another
// transaction holds gives up after innodb_lock_wait_timeout (1205),
// classified transient; a retry after the holder rolls back wins.
func TestLockWaitTimeoutIsTransient(t *testing.T) {
	db := testDB(t)
	db.SetMaxIdleConns(0) // the session variable below must not outlive the test's connection
	s := openStore(t, db)
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
	if _, err := waiter.Tx().Exec(`SET SESSION innodb_lock_wait_timeout = 1`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = waiter.Claim(ctx, "c", []driver.Claim{{ID: "held"}})
	var me *mysqldrv.MySQLError
	if !errors.As(err, &me) || me.Number != 1205 {
		t.Fatalf("claim of a held id: %v; want error 1205", err)
	}
	if waited := time.Since(start); waited < 900*time.Millisecond {
		t.Fatalf("claim failed after %v without waiting for the lock", waited)
	}
	if !mysql.IsTransient(err) {
		t.Fatalf("lock wait timeout not transient: %v", err)
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
// claims: InnoDB aborts one with 1213, which is transient; its retry finds
// both ids claimed by the winner, whose effects are the only ones
// committed.
func TestDeadlockIsTransient(t *testing.T) {
	db := testDB(t)
	s := openStore(t, db)
	fx := effectsTable(t, db)
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
	claimApply := func(txn driver.Txn[*sql.Tx], id string) error {
		res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: id}})
		if err != nil {
			return err
		}
		if res[0] != driver.ClaimWon {
			return errors.New("claim of " + id + " lost: " + res[0].String())
		}
		_, err = txn.Tx().ExecContext(ctx, `INSERT INTO `+fx+` (k) VALUES (?)`, id)
		return err
	}
	if err := claimApply(a, "x"); err != nil {
		t.Fatal(err)
	}
	if err := claimApply(b, "y"); err != nil {
		t.Fatal(err)
	}
	errA := make(chan error, 1)
	go func() { errA <- claimApply(a, "y") }()
	time.Sleep(100 * time.Millisecond) // let a block on y first
	errB := claimApply(b, "x")
	var loser, winner driver.Txn[*sql.Tx]
	var lossErr error
	if errB != nil {
		loser, winner, lossErr = b, a, errB
		if err := <-errA; err != nil {
			t.Fatalf("both failed: %v / %v", err, errB)
		}
	} else {
		loser, winner, lossErr = a, b, <-errA
	}
	var me *mysqldrv.MySQLError
	if !errors.As(lossErr, &me) || me.Number != 1213 {
		t.Fatalf("want a deadlock (1213), got %v", lossErr)
	}
	if !mysql.IsTransient(lossErr) {
		t.Fatalf("deadlock not transient: %v", lossErr)
	}
	loser.Rollback(ctx)
	if err := winner.Commit(ctx); err != nil {
		t.Fatal(err)
	}
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
		if err := db.QueryRow(`SELECT count(*) FROM `+fx+` WHERE k = ?`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if res[i] != driver.ClaimDuplicate || n != 1 {
			t.Fatalf("id %s: retry %v with %d effects; want duplicate with 1", id, res[i], n)
		}
	}
}

func TestRunPruner(t *testing.T) {
	db := testDB(t)
	clock := storetest.NewClock(time.Now().Add(-2 * time.Hour))
	s := openStore(t, db, mysql.WithClock(clock.Now), mysql.WithRetention(time.Hour))
	ctx := context.Background()
	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]driver.Claim, 25)
	for i := range ids {
		ids[i] = driver.Claim{ID: "old" + strconv.Itoa(i)}
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
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.RunPruner(pctx, 20*time.Millisecond, 10, nil) }()
	deadline := time.Now().Add(10 * time.Second)
	var n int
	for time.Now().Before(deadline) {
		db.QueryRow(`SELECT count(*) FROM ` + s.Table()).Scan(&n)
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
	db.QueryRow(`SELECT GROUP_CONCAT(message_id) FROM ` + s.Table()).Scan(&left)
	if left != "fresh" {
		t.Fatalf("rows left after pruning: %q, want only fresh", left)
	}
}

// TestClaimAfterSnapshot: under REPEATABLE READ a transaction that read
// before claiming has a snapshot older than a claim another transaction
// committed since; the claim must still see that row and lose.
func TestClaimAfterSnapshot(t *testing.T) {
	for name, mode := range map[string]mysql.ClaimMode{"auto": mysql.ClaimAuto, "readback": mysql.ClaimReadBack} {
		t.Run(name, func(t *testing.T) {
			db := testDB(t)
			s := openStore(t, db, mysql.WithClaimMode(mode))
			ctx := context.Background()
			late, err := s.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer late.Rollback(ctx)
			var n int
			if err := late.Tx().QueryRow(`SELECT count(*) FROM ` + s.Table()).Scan(&n); err != nil {
				t.Fatal(err) // takes the snapshot
			}
			early, err := s.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			fp := core.Fingerprint([]byte("body"))
			if res, err := early.Claim(ctx, "c", []driver.Claim{{ID: "z", Fingerprint: fp}}); err != nil || res[0] != driver.ClaimWon {
				t.Fatalf("early claim: %v %v", res, err)
			}
			if err := early.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			res, err := late.Claim(ctx, "c", []driver.Claim{{ID: "z", Fingerprint: core.Fingerprint([]byte("other"))}, {ID: "w"}})
			if err != nil {
				t.Fatal(err)
			}
			if res[0] != driver.ClaimMismatch || res[1] != driver.ClaimWon {
				t.Fatalf("claim after an old snapshot: %v, want [mismatch won]", res)
			}
		})
	}
}

// TestIsTransientRejects: errors that a retry cannot cure are not
// transient (a missing table, bad SQL, a duplicate key in a business
// table).
func TestIsTransientRejects(t *testing.T) {
	db := testDB(t)
	fx := effectsTable(t, db)
	if _, err := db.Exec(`ALTER TABLE ` + fx + ` ADD UNIQUE KEY (n)`); err != nil {
		t.Fatal(err)
	}
	db.Exec(`INSERT INTO ` + fx + ` (k, n) VALUES ('a', 1)`)
	for _, q := range []string{
		`SELECT * FROM idemq_no_such_table`,
		`SELEC 1`,
		`INSERT INTO ` + fx + ` (k, n) VALUES ('b', 1)`,
	} {
		_, err := db.Exec(q)
		if err == nil {
			t.Fatalf("%s succeeded", q)
		}
		if mysql.IsTransient(err) {
			t.Errorf("%s: %v classified transient", q, err)
		}
	}
	if mysql.IsTransient(nil) {
		t.Error("nil is transient")
	}
}
