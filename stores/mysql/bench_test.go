package mysql_test

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/stores/mysql"
	"github.com/idemq/idemq/stores/storetest"
)

// BenchmarkClaim measures, per message, the dedup transaction against a
// bare transaction running the same business UPDATE: one message per
// transaction, and 100 messages per transaction (one claim statement, with
// and without a savepoint per message). Every op is one message, so ns/op
// compares directly; the ratios are the store's added cost.
func BenchmarkClaim(b *testing.B) {
	db := testDB(b)
	auto := openStore(b, db)
	readBack := openStore(b, db, mysql.WithClaimMode(mysql.ClaimReadBack))
	ctx := context.Background()
	accounts := storetest.UniqueName("idemq_acct_")
	if _, err := db.Exec(`CREATE TABLE ` + accounts + ` (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB`); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Exec(`DROP TABLE IF EXISTS ` + accounts) })
	rows := make([]string, 100)
	for i := range rows {
		rows[i] = "(" + strconv.Itoa(i) + ",0)"
	}
	if _, err := db.Exec(`INSERT INTO ` + accounts + ` VALUES ` + strings.Join(rows, ",")); err != nil {
		b.Fatal(err)
	}
	update := `UPDATE ` + accounts + ` SET balance = balance + 1 WHERE id = ?`
	prefix := storetest.UniqueName("")
	seq := 0
	nextID := func() string { seq++; return prefix + strconv.Itoa(seq) }

	run := func(b *testing.B, s *mysql.Store, batch int, dedup, savepoints bool) {
		for done := 0; done < b.N; done += batch {
			n := min(batch, b.N-done)
			var tx *sql.Tx
			var txn driver.Txn[*sql.Tx]
			var err error
			if dedup {
				if txn, err = s.Begin(ctx); err != nil {
					b.Fatal(err)
				}
				tx = txn.Tx()
				cs := make([]driver.Claim, n)
				for i := range cs {
					cs[i] = driver.Claim{ID: nextID(), Fingerprint: "f"}
				}
				res, err := txn.Claim(ctx, "bench", cs)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range res {
					if r != driver.ClaimWon {
						b.Fatalf("claim %v", r)
					}
				}
			} else if tx, err = db.BeginTx(ctx, nil); err != nil {
				b.Fatal(err)
			}
			for i := 0; i < n; i++ {
				if savepoints {
					if err := txn.(driver.Savepointer).Savepoint(ctx); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := tx.ExecContext(ctx, update, (done+i)%100); err != nil {
					b.Fatal(err)
				}
				if savepoints {
					if err := txn.(driver.Savepointer).ReleaseSavepoint(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("bare/1", func(b *testing.B) { run(b, auto, 1, false, false) })
	b.Run("dedup/1", func(b *testing.B) { run(b, auto, 1, true, false) })
	b.Run("bare/100", func(b *testing.B) { run(b, auto, 100, false, false) })
	b.Run("dedup/100", func(b *testing.B) { run(b, auto, 100, true, false) })
	b.Run("dedup/100+savepoints", func(b *testing.B) { run(b, auto, 100, true, true) })
	b.Run("readback/1", func(b *testing.B) { run(b, readBack, 1, true, false) })
	b.Run("readback/100", func(b *testing.B) { run(b, readBack, 100, true, false) })
}
