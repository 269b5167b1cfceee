package postgres_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/storetest"
	"github.com/jackc/pgx/v5"
)

// BenchmarkClaim measures, per message, the dedup transaction against a
// bare transaction running the same business UPDATE: one message per
// transaction, and 100 messages per transaction (one claim statement, with
// and without a savepoint per message). Every op is one message, so ns/op
// compares directly; the ratios are the store's added cost.
func BenchmarkClaim(b *testing.B) {
	pool := testPool(b)
	plain := openStore(b, pool)
	partitioned := openStore(b, pool, postgres.WithPartitions(24*time.Hour))
	ctx := context.Background()
	accounts := storetest.UniqueName("idemq_acct_")
	if _, err := pool.Exec(ctx, `CREATE TABLE `+accounts+` (id INT PRIMARY KEY, balance BIGINT NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+accounts) })
	if _, err := pool.Exec(ctx, `INSERT INTO `+accounts+` SELECT g, 0 FROM generate_series(0, 99) g`); err != nil {
		b.Fatal(err)
	}
	update := `UPDATE ` + accounts + ` SET balance = balance + 1 WHERE id = $1`
	prefix := storetest.UniqueName("")
	seq := 0
	nextID := func() string { seq++; return prefix + strconv.Itoa(seq) }

	run := func(b *testing.B, s *postgres.Store, batch int, dedup, savepoints bool) {
		for done := 0; done < b.N; done += batch {
			n := min(batch, b.N-done)
			if !dedup {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					for i := 0; i < n; i++ {
						if _, err := tx.Exec(ctx, update, (done+i)%100); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				continue
			}
			txn, err := s.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			cs := make([]driver.Claim, n)
			for i := range cs {
				cs[i] = driver.Claim{ID: nextID(), Fingerprint: "f"}
			}
			res, err := txn.Claim(ctx, "bench", cs)
			if err != nil {
				b.Fatal(err)
			}
			for i, r := range res {
				if r != driver.ClaimWon {
					b.Fatalf("claim %v", r)
				}
				if savepoints {
					if err := txn.(driver.Savepointer).Savepoint(ctx); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := txn.Tx().Exec(ctx, update, (done+i)%100); err != nil {
					b.Fatal(err)
				}
				if savepoints {
					if err := txn.(driver.Savepointer).ReleaseSavepoint(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := txn.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("bare/1", func(b *testing.B) { run(b, plain, 1, false, false) })
	b.Run("dedup/1", func(b *testing.B) { run(b, plain, 1, true, false) })
	b.Run("bare/100", func(b *testing.B) { run(b, plain, 100, false, false) })
	b.Run("dedup/100", func(b *testing.B) { run(b, plain, 100, true, false) })
	b.Run("dedup/100+savepoints", func(b *testing.B) { run(b, plain, 100, true, true) })
	b.Run("partitioned/1", func(b *testing.B) { run(b, partitioned, 1, true, false) })
	b.Run("partitioned/100", func(b *testing.B) { run(b, partitioned, 100, true, false) })
}
