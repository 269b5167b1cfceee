package benchmark

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/postgres"
)

// stageTimer counts idemq's transactions and adds up the time spent in
// each store stage (begin, claim, commit), which shows where a batch's time
// goes when idemq is slower than the hand-written consumer.
type stageTimer struct {
	t                    *tracker
	begin, claim, commit atomic.Int64
}

func (o *stageTimer) ObserveStage(_ []context.Context, stage string) func(error) {
	var sum *atomic.Int64
	switch stage {
	case "commit":
		o.t.batches.Add(1)
		sum = &o.commit
	case "begin":
		sum = &o.begin
	case "claim":
		sum = &o.claim
	default:
		return func(error) {}
	}
	start := time.Now()
	return func(error) { sum.Add(int64(time.Since(start))) }
}

// runIdemq runs an idemq configuration over the run's queue and tables
// until ctx is cancelled. Decisions are recorded by a decision middleware,
// so the latency ends where idemq decides (after the commit, before the
// ack), as for the baselines.
func runIdemq(ctx context.Context, e *runEnv, t *tracker, name string) (*counts, error) {
	b, w := e.cfg.BatchSize, e.cfg.BatchWorkers
	stages := &stageTimer{t: t}
	opts := []core.Option{
		core.WithName(e.consumer),
		core.WithLogger(e.logger),
		core.WithStageObserver(stages),
		core.WithMiddleware(func(next core.ProcessFunc) core.ProcessFunc {
			return func(ctx context.Context, m *core.Message) core.Outcome {
				out := next(ctx, m)
				if out.Decision != core.Retry { // a retried delivery is decided again later
					ts, _ := strconv.ParseInt(m.Headers[headerTS], 10, 64)
					t.decided(m.ID, ts)
				}
				return out
			}
		}),
	}
	conns := w + 2
	update := `UPDATE ` + e.accountsTable + ` SET balance_cents = balance_cents + $1 WHERE account = $2`
	perMessage := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		var p payment
		if err := json.Unmarshal(m.Body, &p); err != nil {
			return core.Permanent(err)
		}
		_, err := tx.Exec(ctx, update, p.AmountCents, p.Account)
		return err
	}
	var h core.Handler[pgx.Tx]
	var bh core.BatchHandler[pgx.Tx]
	switch name {
	case IdemqB1W5:
		opts = append(opts, core.WithBatchSize(1), core.WithWindow(5), core.WithConcurrency(1))
		h = perMessage
		conns = 3
	case IdemqB1W100C8:
		opts = append(opts, core.WithBatchSize(1), core.WithWindow(100), core.WithConcurrency(8))
		h = perMessage
		conns = 10
	case IdemqQueue:
		opts = append(opts, core.WithBatchSize(b), core.WithConcurrency(w), core.WithIsolation(core.IsolateReplay))
		h = func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
			var p payment
			if err := json.Unmarshal(m.Body, &p); err != nil {
				return core.Permanent(err)
			}
			return postgres.Queue(ctx, tx, update, p.AmountCents, p.Account)
		}
	default: // IdemqBatch and the scenarios
		opts = append(opts, core.WithBatchSize(b), core.WithConcurrency(w))
		setUpdate := `UPDATE ` + e.accountsTable + ` a SET balance_cents = a.balance_cents + v.amt
FROM (SELECT unnest($1::text[]) AS acc, unnest($2::bigint[]) AS amt) v WHERE a.account = v.acc`
		bh = func(ctx context.Context, tx pgx.Tx, msgs []*core.Message) error {
			// Several messages of a batch may pay into one account: sum
			// per account first, one row each, sorted so concurrent
			// batches lock accounts in one order.
			sums := make(map[string]int64, len(msgs))
			for _, m := range msgs {
				var p payment
				if err := json.Unmarshal(m.Body, &p); err != nil {
					return core.Permanent(err)
				}
				sums[p.Account] += p.AmountCents
			}
			accs := make([]string, 0, len(sums))
			for a := range sums {
				accs = append(accs, a)
			}
			slices.Sort(accs)
			amts := make([]int64, len(accs))
			for i, a := range accs {
				amts[i] = sums[a]
			}
			_, err := tx.Exec(ctx, setUpdate, accs, amts)
			return err
		}
	}
	store, err := core.OpenStore[pgx.Tx](ctx, e.idemqStoreURL(conns))
	if err != nil {
		return nil, err
	}
	if c, ok := store.(io.Closer); ok {
		defer c.Close()
	}
	src, err := core.OpenSource(ctx, e.rabbit.sourceURL(e.queue))
	if err != nil {
		return nil, err
	}
	var c *core.Consumer[pgx.Tx]
	if bh != nil {
		c, err = core.NewBatch(src, store, bh, opts...)
	} else {
		c, err = core.New(src, store, h, opts...)
	}
	if err != nil {
		src.Close()
		return nil, err
	}
	err = c.Run(ctx)
	st := c.Stats()
	var n counts
	n.processed.Store(st.Processed)
	n.duplicates.Store(st.Duplicates)
	n.retried.Store(st.Retried)
	n.deadLettered.Store(st.DeadLettered)
	n.stages = map[string]time.Duration{
		"begin":  time.Duration(stages.begin.Load()),
		"claim":  time.Duration(stages.claim.Load()),
		"commit": time.Duration(stages.commit.Load()),
	}
	return &n, err
}

// discardLogger is used when Config.Progress is nil.
var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))
