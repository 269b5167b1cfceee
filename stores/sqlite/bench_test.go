package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/stores/sqlite"
)

// BenchmarkClaim measures, per message, the dedup transaction against a
// bare transaction running the same business UPDATE: one message per
// transaction, and 100 messages per transaction (one claim statement, with
// and without a savepoint per message). Every op is one message, so ns/op
// compares directly; the ratios are the store's added cost.
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	db := s.DB()
	if _, err := db.Exec(`CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(`WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i+1 FROM g WHERE i < 99) INSERT INTO accounts SELECT i, 0 FROM g`); err != nil {
		b.Fatal(err)
	}
	const update = `UPDATE accounts SET balance = balance + 1 WHERE id = ?`
	seq := 0
	nextID := func() string { seq++; return strconv.Itoa(seq) }

	run := func(b *testing.B, batch int, dedup, savepoints bool) {
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
	b.Run("bare/1", func(b *testing.B) { run(b, 1, false, false) })
	b.Run("dedup/1", func(b *testing.B) { run(b, 1, true, false) })
	b.Run("bare/100", func(b *testing.B) { run(b, 100, false, false) })
	b.Run("dedup/100", func(b *testing.B) { run(b, 100, true, false) })
	b.Run("dedup/100+savepoints", func(b *testing.B) { run(b, 100, true, true) })
}
