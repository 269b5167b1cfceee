package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
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
			var msgs []*core.Message
			for i := range 60 {
				msgs = append(msgs, &core.Message{ID: fmt.Sprintf("q-%02d", i), Body: []byte("x")})
			}
			msgs = append(msgs, &core.Message{ID: "bad", Body: []byte("x")}, &core.Message{ID: "q-07", Body: []byte("x")})
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
			res, err := memory.Drain(dctx, b, "q", func(sub *memory.Subscription) (*core.Consumer[pgx.Tx], error) {
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
