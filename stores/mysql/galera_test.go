package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/mysql"
	"github.com/idemq/idemq/stores/storetest"
)

// TestGalera runs the store on a private three-node MariaDB Galera
// cluster: the conformance suite on one node, one id claimed on two nodes
// at once, consumers on two nodes applying payments with duplicates while
// the third node is SIGKILLed and rejoins, and a node cut off from the
// primary component. The cases share the cluster (starting one takes
// 15–30 s); the last one breaks it.
func TestGalera(t *testing.T) {
	c := servicetest.StartGalera(t, 3)
	dbs := make([]*sql.DB, 3)
	for i, n := range c.Nodes {
		cfg, err := mysqldrv.ParseDSN(n.DSN)
		if err != nil {
			t.Fatal(err)
		}
		cfg.DBName, cfg.InterpolateParams = "test", true
		if i == 0 {
			boot, err := sql.Open("mysql", n.DSN)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := boot.Exec(`CREATE DATABASE test`); err != nil {
				t.Fatal(err)
			}
			boot.Close()
		}
		conn, err := mysqldrv.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		dbs[i] = sql.OpenDB(conn)
		t.Cleanup(func() { dbs[i].Close() })
	}
	// Galera replicates row events by primary key: every table has one.
	ledger := func(t *testing.T) string {
		name := storetest.UniqueName("idemq_ledger_")
		if _, err := dbs[0].Exec(`CREATE TABLE ` + name + ` (seq BIGINT AUTO_INCREMENT PRIMARY KEY, k VARBINARY(2048) NOT NULL, KEY (k(255)))`); err != nil {
			t.Fatal(err)
		}
		return name
	}

	t.Run("Conformance", func(t *testing.T) {
		db, fx := dbs[0], ledger(t)
		storetest.Run(t, storetest.Harness[*sql.Tx]{
			Open: func(t *testing.T, cfg storetest.Config) (driver.Store[*sql.Tx], error) {
				s, err := mysql.New(db, mysql.WithTable(cfg.Table), mysql.WithClock(cfg.Now))
				if err != nil {
					return nil, err
				}
				return s, s.Migrate(context.Background())
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

	// Both nodes' claims win locally; the second COMMIT fails
	// certification (1213), which is transient, and the retry finds the
	// first node's claim: Duplicate, one effect.
	t.Run("ClaimOnTwoNodes", func(t *testing.T) {
		ctx := context.Background()
		table := storetest.UniqueName("idemq_my_")
		stores := make([]*mysql.Store, 2)
		for i := range stores {
			s, err := mysql.New(dbs[i], mysql.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("migrate on node %d: %v", i, err)
			}
			stores[i] = s
		}
		tryClaim := func(i int) (driver.Txn[*sql.Tx], driver.ClaimResult, error) {
			tx, err := stores[i].Begin(ctx)
			if err != nil {
				return nil, 0, err
			}
			res, err := tx.Claim(ctx, "galera", []driver.Claim{{ID: "pay-1"}})
			if err != nil {
				tx.Rollback(ctx)
				return nil, 0, err
			}
			return tx, res[0], nil
		}
		claim := func(i int) (driver.Txn[*sql.Tx], driver.ClaimResult) {
			tx, res, err := tryClaim(i)
			if err != nil {
				t.Fatalf("claim on node %d: %v", i, err)
			}
			return tx, res
		}
		a, ra := claim(0)
		b, rb := claim(1)
		if ra != driver.ClaimWon || rb != driver.ClaimWon {
			t.Fatalf("claims before either commit: %v, %v; want both won locally", ra, rb)
		}
		if err := a.Commit(ctx); err != nil {
			t.Fatalf("first commit: %v", err)
		}
		err := b.Commit(ctx)
		var me *mysqldrv.MySQLError
		if err == nil || !mysql.IsTransient(err) {
			t.Fatalf("second node's commit: %v; want a transient certification failure", err)
		}
		if errors.As(err, &me) {
			t.Logf("second node's commit: %d %s", me.Number, me.Message)
		}
		servicetest.WaitFor(t, 10*time.Second, "the retry on node 1 to find the claim", func() bool {
			tx, res, err := tryClaim(1)
			if err != nil {
				if !mysql.IsTransient(err) {
					t.Fatalf("retry on node 1: %v", err)
				}
				return false
			}
			tx.Rollback(ctx)
			return res == driver.ClaimDuplicate
		})
	})

	// Row locks are node-local, but a lease is a row write: two nodes
	// acquiring one id at once never both win (the loser's commit fails
	// certification, transient, or it finds the lease busy).
	t.Run("LeaseOnTwoNodes", func(t *testing.T) {
		ctx := context.Background()
		table := storetest.UniqueName("idemq_my_")
		stores := make([]*mysql.Store, 2)
		for i := range stores {
			s, err := mysql.New(dbs[i], mysql.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			stores[i] = s
		}
		won, conflicts := 0, 0
		for k := range 30 {
			id := fmt.Sprintf("lease-%d", k)
			var results [2]driver.LeaseResult
			var errs [2]error
			var wg sync.WaitGroup
			for i := range 2 {
				wg.Go(func() {
					l, err := stores[i].Acquire(ctx, "galera", driver.Claim{ID: id}, time.Minute)
					results[i], errs[i] = l.Result, err
				})
			}
			wg.Wait()
			n := 0
			for i := range 2 {
				switch {
				case errs[i] != nil && mysql.IsTransient(errs[i]):
					conflicts++
				case errs[i] != nil:
					t.Fatalf("%s on node %d: %v", id, i, errs[i])
				case results[i] == driver.LeaseWon:
					n++
				}
			}
			if n > 1 {
				t.Fatalf("%s: both nodes won the lease", id)
			}
			won += n
		}
		t.Logf("30 ids raced on two nodes: %d leases won, %d certification conflicts", won, conflicts)
		if won == 0 {
			t.Fatal("no lease won at all")
		}
	})

	// An operator reading on another node right after a commit sees the
	// claim when the URL asks the node to wait for the cluster
	// (mysql.wsrep_sync_wait=1, a session variable). A claim's commit may
	// fail certification (1213, transient) now and then; it is run again,
	// as the Consumer would.
	t.Run("LookupOnAnotherNode", func(t *testing.T) {
		ctx := context.Background()
		table := storetest.UniqueName("idemq_my_")
		st, err := mysql.New(dbs[0], mysql.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		ops, err := admin.OpenStore(ctx, fmt.Sprintf("mysql://root@127.0.0.1:%d/test?table=%s&mysql.wsrep_sync_wait=1", c.Nodes[2].Port, table))
		if err != nil {
			t.Fatal(err)
		}
		defer ops.Close()
		for k := range 50 {
			id := fmt.Sprintf("look-%d", k)
			claim := func() error {
				tx, err := st.Begin(ctx)
				if err != nil {
					return err
				}
				if _, err := tx.Claim(ctx, "galera", []driver.Claim{{ID: id}}); err != nil {
					tx.Rollback(ctx)
					return err
				}
				return tx.Commit(ctx)
			}
			err := claim()
			for try := 0; err != nil && mysql.IsTransient(err) && try < 5; try++ {
				t.Logf("%s: %v; claiming again", id, err)
				err = claim()
			}
			if err != nil {
				t.Fatal(err)
			}
			info, err := ops.Lookup(ctx, "galera", []string{id})
			if err != nil {
				t.Fatal(err)
			}
			if !info[0].Claimed {
				t.Fatalf("%s committed on node 0 but missing on node 2", id)
			}
		}
	})

	// Consumers on nodes 0 and 1 apply payments with 20% duplicates
	// while node 2 is SIGKILLed and rejoins by state transfer: every
	// payment once.
	t.Run("ConsumersOnTwoNodesNodeKilled", func(t *testing.T) {
		const n = 20_000
		ctx := context.Background()
		fx, table := ledger(t), storetest.UniqueName("idemq_my_")
		b, err := memory.NewBroker(memory.WithSeed(7), memory.WithVisibilityTimeout(5*time.Second), memory.WithFaults(memory.Faults{DuplicatePublish: 0.2}))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		msgs := make([]*driver.Message, n)
		for i := range msgs {
			msgs[i] = &driver.Message{ID: fmt.Sprintf("pay-%05d", i), Body: []byte("{}")}
		}
		if err := b.Publish(ctx, "payments", msgs...); err != nil {
			t.Fatal(err)
		}
		total := b.Stats("payments").Published
		logger := slog.New(slog.NewTextHandler(io.Discard, nil))
		// Every payment is applied once, so nothing may be dead-lettered;
		// the causes say why if one is.
		var parkedMu sync.Mutex
		var parked []string
		park := core.DecisionFunc(func(_ context.Context, m *core.Message, out core.Outcome) {
			if out.Decision == core.DeadLetter {
				parkedMu.Lock()
				parked = append(parked, fmt.Sprintf("%s (attempt %d): %v", m.ID, m.Attempt, out.Err))
				parkedMu.Unlock()
			}
		})
		var consumers []*core.Consumer[*sql.Tx]
		rctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i := range 2 {
			st, err := mysql.New(dbs[i], mysql.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			sub, err := b.Subscribe("payments")
			if err != nil {
				t.Fatal(err)
			}
			c, err := core.New(sub, st, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO `+fx+` (k) VALUES (?)`, m.ID)
				return err
			}, core.WithName("galera"), core.WithBatchSize(20), core.WithLogger(logger), core.WithBackoff(core.ConstantBackoff(20*time.Millisecond)), core.WithObserver(park))
			if err != nil {
				t.Fatal(err)
			}
			consumers = append(consumers, c)
			wg.Add(1)
			go func() { defer wg.Done(); c.Run(rctx) }()
		}
		decided := func() (d int64) {
			for _, c := range consumers {
				st := c.Stats()
				d += st.Processed + st.Duplicates
			}
			return d
		}
		servicetest.WaitFor(t, 3*time.Minute, "a fifth of the payments decided", func() bool { return decided() >= total/5 })
		c.Nodes[2].Kill()
		before := decided()
		killed := time.Now()
		c.Rejoin(2)
		t.Logf("node 2 SIGKILLed with %d of %d decided, back in the cluster and synced %.1fs later", before, total, time.Since(killed).Seconds())
		servicetest.WaitFor(t, 8*time.Minute, "every delivery decided", func() bool { return decided() >= total && b.Stats("payments").InFlight == 0 })
		cancel()
		wg.Wait()
		var stats []core.Stats
		for _, c := range consumers {
			stats = append(stats, c.Stats())
		}
		// Read on the rejoined node, waiting for what the cluster committed.
		conn, err := dbs[2].Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, `SET SESSION wsrep_sync_wait = 1`); err != nil {
			t.Fatal(err)
		}
		rows, err := conn.QueryContext(ctx, `SELECT k, count(*) FROM `+fx+` GROUP BY k`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		applied := map[string]int{}
		for rows.Next() {
			var k string
			var c int
			if err := rows.Scan(&k, &c); err != nil {
				t.Fatal(err)
			}
			applied[k] = c
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if applied[m.ID] != 1 {
				t.Errorf("%s applied %d times, want 1", m.ID, applied[m.ID])
			}
		}
		if len(applied) != n {
			t.Errorf("%d ids applied, want %d", len(applied), n)
		}
		for _, p := range parked {
			t.Errorf("dead-lettered: %s", p)
		}
		t.Logf("%d payments + %d copies; consumer on node 0 %+v; on node 1 %+v", n, total-n, stats[0], stats[1])
	})

	// A node alone after the other two die is outside the primary
	// component and answers 1047 (WSREP not ready): transient, like a
	// lost connection.
	t.Run("NonPrimaryIsTransient", func(t *testing.T) {
		ctx := context.Background()
		st, err := mysql.New(dbs[0], mysql.WithTable(storetest.UniqueName("idemq_my_")))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		c.Nodes[1].Kill()
		c.Nodes[2].Kill()
		var last error
		servicetest.WaitFor(t, time.Minute, "node 0 to leave the primary component", func() bool {
			tx, err := st.Begin(ctx)
			if err == nil {
				_, err = tx.Claim(ctx, "galera", []driver.Claim{{ID: "x"}})
				tx.Rollback(ctx)
			}
			last = err
			var me *mysqldrv.MySQLError
			return errors.As(err, &me) && me.Number == 1047
		})
		if !mysql.IsTransient(last) {
			t.Fatalf("IsTransient(%v) = false, want true", last)
		}
		// The node still answers the protocol's ping; the store's Ping,
		// which the Consumer probes with, must not, or a handler's refused
		// statements would spend delivery attempts instead of pausing.
		if err := dbs[0].PingContext(ctx); err != nil {
			t.Logf("the protocol's ping fails too: %v", err)
		}
		if err := st.Ping(ctx); err == nil || !mysql.IsTransient(err) {
			t.Fatalf("Ping on a node outside the primary component: %v, want a transient error", err)
		}
	})
}
