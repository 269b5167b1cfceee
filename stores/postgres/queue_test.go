package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/drain"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/postgres"
)

// Statements queued by per-message handlers go in one round trip per batch;
// a queued statement that fails is pinned on its own message, under both
// isolation modes, and every other message is applied exactly once.
func TestQueuedStatementsThroughThePipeline(t *testing.T) {
	for _, iso := range []core.Isolation{core.IsolateReplay, core.IsolateSavepoints} {
		t.Run(fmt.Sprint("isolation=", iso), func(t *testing.T) {
			pool := testPool(t)
			store := openStore(t, pool)
			fx := effectsTable(t, pool)
			ctx := context.Background()
			// A CHECK constraint makes the queued insert of "bad" fail at
			// flush time, not when the handler queues it.
			if _, err := pool.Exec(ctx, `ALTER TABLE `+fx+` ADD CONSTRAINT not_bad CHECK (k <> 'bad')`); err != nil {
				t.Fatal(err)
			}
			b, err := memory.NewBroker()
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			var msgs []*driver.Message
			for i := range 60 {
				msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("q-%02d", i), Body: []byte("x")})
			}
			msgs = append(msgs, &driver.Message{ID: "bad", Body: []byte("x")}, &driver.Message{ID: "q-07", Body: []byte("x")})
			if err := b.Publish(ctx, "q", msgs...); err != nil {
				t.Fatal(err)
			}
			var sawOwnWrite int
			h := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
				if err := postgres.Queue(ctx, tx, `INSERT INTO `+fx+` (k) VALUES ($1)`, m.ID); err != nil {
					return err
				}
				if m.ID == "q-30" {
					// A read after queuing sends the queue first.
					var n int
					if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+fx+` WHERE k = $1`, m.ID).Scan(&n); err != nil {
						return err
					}
					sawOwnWrite = n
				}
				return postgres.Queue(ctx, tx, `UPDATE `+fx+` SET n = n + 1 WHERE k = $1`, m.ID)
			}
			dctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			res, err := drain.Drain(dctx, b, "q", func(sub *memory.Subscription) (*core.Consumer[pgx.Tx], error) {
				return core.New[pgx.Tx](sub, store, h, core.WithName("queue-test"), core.WithBatchSize(50),
					core.WithLinger(100*time.Millisecond), core.WithIsolation(iso), core.WithMaxAttempts(2),
					core.WithBackoff(core.ConstantBackoff(time.Millisecond)), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Processed != 60 || res.Duplicates != 1 || res.DeadLettered != 1 {
				t.Errorf("stats %+v, want 60 processed, 1 duplicate, 1 dead letter", res.Stats)
			}
			if dl := b.DeadLetters("q"); len(dl) != 1 || dl[0].Message.ID != "bad" {
				t.Errorf("dead letters %+v, want only \"bad\"", dl)
			}
			var rows, bad, wrongN int
			if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE k = 'bad'), count(*) FILTER (WHERE n <> 1) FROM `+fx).Scan(&rows, &bad, &wrongN); err != nil {
				t.Fatal(err)
			}
			if rows != 60 || bad != 0 || wrongN != 0 {
				t.Errorf("%d effect rows (%d bad, %d with n≠1), want 60 applied once each", rows, bad, wrongN)
			}
			if sawOwnWrite != 1 {
				t.Errorf("a read after Queue saw %d rows of the queued insert, want 1", sawOwnWrite)
			}
		})
	}
}

// roundTrips counts what a pool sends: single statements and batches, each
// one round trip.
type roundTrips struct{ queries, batches atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.queries.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.batches.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// A batch transaction whose handlers queue their statements takes two
// round trips: BEGIN with the claim, then the statements with the COMMIT.
// Rollback after it sends nothing and the connection is back in the pool.
// A queued statement the server refuses comes back as a FlushError and
// commits nothing.
func TestFlushCommitRoundTrips(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(postgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	trips := &roundTrips{}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store := openStore(t, pool)
	fx := effectsTable(t, pool)
	if _, err := pool.Exec(ctx, `ALTER TABLE `+fx+` ADD CONSTRAINT not_bad CHECK (k <> 'bad')`); err != nil {
		t.Fatal(err)
	}

	run := func(prefix string, ids ...string) error {
		txn, err := store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer txn.Rollback(ctx)
		claims := make([]driver.Claim, len(ids))
		for i, id := range ids {
			claims[i] = driver.Claim{ID: prefix + id, Fingerprint: "f"}
		}
		if _, err := txn.Claim(ctx, "rt", claims); err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if err := postgres.Queue(ctx, txn.Tx(), `INSERT INTO `+fx+` (k) VALUES ($1)`, id); err != nil {
				t.Fatal(err)
			}
		}
		return txn.(driver.FlushCommitter).FlushCommit(ctx)
	}
	ids := make([]string, 50)
	for i := range ids {
		ids[i] = fmt.Sprintf("k%02d", i)
	}
	trips.queries.Store(0)
	trips.batches.Store(0)
	if err := run("ok-", ids...); err != nil {
		t.Fatalf("FlushCommit: %v", err)
	}
	if q, b := trips.queries.Load(), trips.batches.Load(); q != 0 || b != 2 {
		t.Errorf("a transaction of 50 queued statements took %d statements and %d batches, want 0 and 2", q, b)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired after FlushCommit", n)
	}
	var rows, claims int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+fx).Scan(&rows); err != nil || rows != 50 {
		t.Fatalf("%d effect rows (%v), want 50", rows, err)
	}

	err = run("bad-", "a", "bad", "c")
	var fe *driver.FlushError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "not_bad") {
		t.Fatalf("FlushCommit with a refused statement = %v, want a FlushError naming the constraint", err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+fx).Scan(&rows); err != nil || rows != 50 {
		t.Errorf("%d effect rows after the refused batch (%v), want still 50", rows, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+store.Table()+` WHERE message_id LIKE 'bad-%'`).Scan(&claims); err != nil || claims != 0 {
		t.Errorf("%d claims of the refused batch (%v), want 0", claims, err)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired after the refused batch's rollback", n)
	}
}
