package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/idemq/idemq/core"
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

// BenchmarkClaimBatch measures one dedup transaction claiming a batch of
// 200 ids, of which 40 (20%) were claimed by the previous transaction with
// the same fingerprint: Begin, Claim, Commit. Ids are 36-byte UUID-like
// strings in random order and fingerprints the Consumer's default 22
// bytes, so the statement has the width of a real batch's. One op is one
// transaction.
func BenchmarkClaimBatch(b *testing.B) {
	const batch, dups = 200, 40
	db := testDB(b)
	s := openStore(b, db)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	newID := func() string {
		return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", rng.Uint32(), rng.Uint32()&0xffff, rng.Uint32()&0xffff, rng.Uint32()&0xffff, rng.Uint64()&(1<<48-1))
	}
	fp := func(id string) string { return core.Fingerprint([]byte(id)) }
	prev := make([]string, 0, batch)
	claim := func() {
		cs := make([]driver.Claim, 0, batch)
		for _, id := range prev[:min(dups, len(prev))] {
			cs = append(cs, driver.Claim{ID: id, Fingerprint: fp(id)})
		}
		known := len(cs)
		for len(cs) < batch {
			id := newID()
			cs = append(cs, driver.Claim{ID: id, Fingerprint: fp(id)})
		}
		rng.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
		txn, err := s.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		res, err := txn.Claim(ctx, "bench", cs)
		if err != nil {
			b.Fatal(err)
		}
		prev = prev[:0]
		won := 0
		for i, r := range res {
			switch r {
			case driver.ClaimWon:
				won++
				prev = append(prev, cs[i].ID)
			case driver.ClaimDuplicate:
			default:
				b.Fatalf("claim of %q: %v", cs[i].ID, r)
			}
		}
		if won != batch-known {
			b.Fatalf("%d claims won, want %d", won, batch-known)
		}
		if err := txn.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	claim() // the first batch's ids are the second's duplicates
	b.ResetTimer()
	for b.Loop() {
		claim()
	}
}
