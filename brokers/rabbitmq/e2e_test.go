package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
)

// postgresURL returns the Postgres URL from IDEMQ_POSTGRES_URL (default the
// local server); unreachable skips, or fails with IDEMQ_REQUIRE_SERVICES=1.
func postgresURL(t testing.TB) string {
	t.Helper()
	return servicetest.PostgresURL(t)
}

// crashAfter wraps a Source so that, once armed, its crashAt-th Ack call
// closes the source instead of acknowledging: the process committed its
// transaction and died before the ack reached the broker.
type crashAfter struct {
	*Source
	crashAt int64       // counted once armed; 0: never
	armed   atomic.Bool // the test arms it once the life's cuts are done
	acks    atomic.Int64
	crashed atomic.Bool
}

// Ack crashes instead of acking on the crashAt-th call.
func (c *crashAfter) Ack(ctx context.Context, ms []*driver.Message) error {
	if c.crashAt > 0 && c.armed.Load() && c.acks.Add(1) == c.crashAt {
		c.crashed.Store(true)
		_ = c.Source.Close()
		return errors.New("crashed between commit and ack")
	}
	return c.Source.Ack(ctx, ms)
}

// TestEndToEndPostgres publishes 20,000 messages plus 20% duplicate
// publishes, and consumes them into Postgres through a connection that is
// cut several times mid-stream, with consumer "processes" that die between
// commit and ack three times and are restarted. Every message's effect
// must be committed exactly once, none lost, and the queue must end empty.
func TestEndToEndPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("20,000-message end-to-end test skipped with -short")
	}
	amqpU := amqpURL(t)
	pgURL := postgresURL(t)
	q := uniqueQueue(t, amqpU)
	ctx := context.Background()
	suffix := q[len("idemq-test-"):]
	effects, dedup := "e2e_effects_"+suffix, "e2e_processed_"+suffix

	store, err := postgres.Open(ctx, pgURL, postgres.WithTable(dedup))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	pool := store.Pool()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (id TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+effects+`, `+dedup) })

	// Declare, then publish 20,000 ids and 4,000 second copies, shuffled.
	s0, err := Open(ctx, amqpU, WithQueue(q))
	if err != nil {
		t.Fatal(err)
	}
	s0.Close()
	const unique = 20000
	msgs := make([]*driver.Message, 0, unique*6/5)
	for i := range unique {
		msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("order-%05d", i), Body: fmt.Appendf(nil, `{"order":%d}`, i)})
	}
	for _, i := range rand.Perm(unique)[:unique/5] {
		msgs = append(msgs, msgs[i])
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	pub, err := NewPublisher(ctx, amqpU)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := pub.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	pub.Close()
	t.Logf("published %d messages in %v", len(msgs), time.Since(start))

	handler := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (id) VALUES ($1)`, m.ID)
		return err
	}
	distinct := func() int {
		var n int
		pool.QueryRow(ctx, `SELECT count(DISTINCT id) FROM `+effects).Scan(&n)
		return n
	}

	p := newProxy(t, mustHostPort(t, amqpU))
	purl := proxiedURL(t, amqpU, p)
	var total core.Stats
	var reconnects, stale int64
	crashes, cuts := 0, 0
	start = time.Now()
	// Each life has its connection cut twice; lives 1-3 then crash
	// between commit and ack at their 10th batch ack after the second cut;
	// life 4 runs to the end.
	for life := 1; ; life++ {
		src, err := Open(ctx, purl, WithQueue(q), WithLogger(testLogger(t)), WithReconnectBackoff(20*time.Millisecond, 500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		wrapped := &crashAfter{Source: src}
		if life <= 3 {
			wrapped.crashAt = 10
		}
		c, err := core.New[pgx.Tx](wrapped, store, handler, core.WithName("e2e"),
			core.WithBatchSize(100), core.WithWindow(400), core.WithConcurrency(4), core.WithLogger(testLogger(t)))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		var runErr error
		finished := false
		lifeCuts := 0
		tick := time.NewTicker(20 * time.Millisecond)
		for !finished {
			select {
			case runErr = <-done:
				finished = true
				continue
			case <-tick.C:
			}
			st := c.Stats()
			decided := st.Processed + st.Duplicates
			if lifeCuts < 2 && decided > int64(500*(lifeCuts+1)) {
				p.cut()
				lifeCuts++
				cuts++
				if lifeCuts == 2 {
					wrapped.armed.Store(true)
				}
			}
			if life > 3 && distinct() == unique && queueDepth(t, amqpU, q) == 0 && st.Received == decided {
				stop()
				runErr = <-done
				finished = true
			}
			if time.Since(start) > 5*time.Minute {
				stop()
				<-done
				t.Fatalf("not done after 5 minutes: %d of %d ids applied", distinct(), unique)
			}
		}
		tick.Stop()
		stop()
		st, sst := c.Stats(), src.Stats()
		t.Logf("life %d: crashed=%v run=%v consumer %+v source %+v", life, wrapped.crashed.Load(), runErr, st, sst)
		if wrapped.crashed.Load() {
			crashes++
			if !errors.Is(runErr, core.ErrSourceClosed) {
				t.Fatalf("life %d: Run after the crash = %v, want ErrSourceClosed", life, runErr)
			}
		} else if runErr != nil {
			t.Fatalf("life %d: Run = %v", life, runErr)
		}
		total.Processed += st.Processed
		total.Duplicates += st.Duplicates
		total.Retried += st.Retried
		total.DeadLettered += st.DeadLettered
		total.SettleErrors += st.SettleErrors
		reconnects += sst.Reconnects
		stale += sst.StaleSettlements
		if life > 3 {
			if d := queueDepth(t, amqpU, q); d != 0 {
				t.Logf("life %d left %d messages (acks lost at shutdown); another life drains them", life, d)
				continue
			}
			break
		}
	}
	elapsed := time.Since(start)
	t.Logf("%d deliveries decided in %v (%.0f msgs/s) through %d crashes, %d cuts (%d reconnects, %d stale settlements refused); processed %d, duplicates %d, retried %d, dead-lettered %d",
		total.Processed+total.Duplicates, elapsed, float64(total.Processed+total.Duplicates)/elapsed.Seconds(), crashes, cuts, reconnects, stale,
		total.Processed, total.Duplicates, total.Retried, total.DeadLettered)

	var rows, ids int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM `+effects).Scan(&rows, &ids); err != nil {
		t.Fatal(err)
	}
	if rows != unique || ids != unique {
		t.Fatalf("effects: %d rows for %d ids, want each of %d ids exactly once", rows, ids, unique)
	}
	if total.Processed != unique {
		t.Errorf("Processed = %d over all lives, want %d", total.Processed, unique)
	}
	if total.Duplicates < unique/5 {
		t.Errorf("Duplicates = %d, want at least the %d duplicate publishes", total.Duplicates, unique/5)
	}
	if total.DeadLettered != 0 {
		t.Errorf("DeadLettered = %d, want 0", total.DeadLettered)
	}
	if crashes != 3 || cuts < 8 {
		t.Errorf("%d crashes and %d cuts injected, want 3 and >= 8", crashes, cuts)
	}
	if d := queueDepth(t, amqpU, q+".dlq"); d != 0 {
		t.Errorf("dead-letter queue holds %d messages", d)
	}
}
