package memory_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/drain"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/sqlite"
)

// TestDrainAppliesEveryEffectOnceThroughFaults is the quickstart in
// miniature: duplicate publishes, lost acks and crashes between commit and
// ack, consumed by core.Consumer on SQLite through Drain, which restarts
// crashed consumers. Every id's effect must be committed exactly once.
func TestDrainAppliesEveryEffectOnceThroughFaults(t *testing.T) {
	for _, batch := range []int{1, 20} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			ctx := context.Background()
			store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "drain.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			if _, err := store.DB().ExecContext(ctx, `CREATE TABLE effects (id TEXT NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			b := newBroker(t, memory.WithSeed(3), memory.WithVisibilityTimeout(300*time.Millisecond),
				memory.WithFaults(memory.Faults{DuplicatePublish: 0.2}))
			const n = 300
			publish(t, b, "pay", ids(n)...)
			if err := b.SetFaults(memory.Faults{LoseAck: 0.02, CrashOnAck: 0.01}); err != nil {
				t.Fatal(err)
			}
			handler := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, m.ID)
				return err
			}
			logger := slog.New(slog.NewTextHandler(io.Discard, nil))
			dctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			res, err := drain.Drain(dctx, b, "pay", func(s *memory.Subscription) (*core.Consumer[*sql.Tx], error) {
				return core.New[*sql.Tx](s, store, handler, core.WithName("drain"), core.WithBatchSize(batch),
					core.WithLogger(logger), core.WithBackoff(core.ConstantBackoff(5*time.Millisecond)))
			})
			if err != nil {
				t.Fatalf("Drain: %v", err)
			}
			rows, err := store.DB().QueryContext(ctx, `SELECT id, count(*) FROM effects GROUP BY id`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			applied := map[string]int{}
			for rows.Next() {
				var id string
				var c int
				if err := rows.Scan(&id, &c); err != nil {
					t.Fatal(err)
				}
				applied[id] = c
			}
			for _, id := range ids(n) {
				if applied[id] != 1 {
					t.Errorf("%s applied %d times", id, applied[id])
				}
			}
			st := b.Stats("pay")
			if b.Len("pay") != 0 || st.DuplicatesPublished == 0 || res.Processed != n || res.Duplicates == 0 {
				t.Fatalf("drain result %+v, broker stats %+v", res, st)
			}
			if st.AcksLost+st.Crashes == 0 {
				t.Fatalf("no ack fault was injected: %+v", st)
			}
			t.Logf("batch %d: %+v; broker: lost acks %d, crashes %d, redelivered %d", batch, res, st.AcksLost, st.Crashes, st.Redelivered)
		})
	}
}
