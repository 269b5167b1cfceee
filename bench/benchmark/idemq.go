package benchmark

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/middleware/metrics"
	"github.com/idemq/idemq/middleware/tracing"
	"github.com/idemq/idemq/stores/postgres"
)

// stageTimer counts idemq's transactions and adds up the time spent in
// each store stage (begin, claim, commit), which shows where a batch's time
// goes when idemq is slower than the hand-written consumer.
type stageTimer struct {
	t                    *tracker
	begin, claim, commit atomic.Int64
	// lease and external are a leased Consumer's per-message stages.
	lease, external atomic.Int64
}

// StartDecision implements core.Observer; decisions are recorded by
// recordingSource.
func (o *stageTimer) StartDecision(ctx context.Context, _ *core.Message) context.Context { return ctx }

// EndDecision implements core.Observer.
func (o *stageTimer) EndDecision(context.Context, *core.Message, core.Outcome) {}

type stageStartKey struct{}

// StartStage implements core.StageObserver: it notes the stage's start.
func (o *stageTimer) StartStage(ctx context.Context, s core.Stage) context.Context {
	if s.Name == "commit" {
		o.t.batches.Add(1)
	}
	return context.WithValue(ctx, stageStartKey{}, time.Now())
}

// EndStage implements core.StageObserver: it adds the stage's time to its
// sum.
func (o *stageTimer) EndStage(ctx context.Context, s core.Stage, _ error) {
	var sum *atomic.Int64
	switch s.Name {
	case "commit":
		sum = &o.commit
	case "begin":
		sum = &o.begin
	case "claim":
		sum = &o.claim
	case "lease":
		sum = &o.lease
	case "external":
		sum = &o.external
	default:
		return
	}
	if start, ok := ctx.Value(stageStartKey{}).(time.Time); ok {
		sum.Add(int64(time.Since(start)))
	}
}

// observers returns the tracing and metrics observers on the OpenTelemetry
// SDK, as a service exporting them runs: spans batched to an exporter that
// drops them, metrics into a manual reader. The providers live as long as
// the benchmark process.
func observers(sampler sdktrace.Sampler) []core.Observer {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSampler(sampler))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	met, err := metrics.New(metrics.WithMeterProvider(mp))
	if err != nil {
		panic(err) // the SDK refuses no instrument
	}
	tr, err := tracing.New(tracing.WithTracerProvider(tp))
	if err != nil {
		panic(err) // the provider is set
	}
	return []core.Observer{tr, met}
}

// idemqShape is what an idemq configuration name asks for.
type idemqShape int

const (
	shapeOne   idemqShape = iota // batch size 1, per-message handler
	shapeQueue                   // batch mode, per-message handler, IsolateReplay
	shapeBatch                   // batch mode, set-based BatchHandler
)

// idemqOptions returns the core options of an idemq configuration, the
// handler shape it uses, and the store connections it needs. Decisions are
// recorded by recordingSource when idemq settles them (right after the
// commit), as the baselines record theirs before the ack.
func idemqOptions(e *runEnv, _ *tracker, name string, stages *stageTimer) ([]core.Option, idemqShape, int) {
	b, w := e.cfg.BatchSize, e.cfg.BatchWorkers
	opts := []core.Option{
		core.WithName(e.consumer),
		core.WithLogger(e.logger),
		core.WithObserver(stages),
	}
	switch name {
	case IdemqB1W5:
		return append(opts, core.WithBatchSize(1), core.WithWindow(5), core.WithConcurrency(1)), shapeOne, 3
	case IdemqB1W100C8:
		return append(opts, core.WithBatchSize(1), core.WithWindow(100), core.WithConcurrency(8)), shapeOne, 10
	case IdemqQueue:
		return append(opts, core.WithBatchSize(b), core.WithConcurrency(w), core.WithIsolation(core.IsolateReplay)), shapeQueue, w + 2
	case IdemqBatchObserved:
		opts = append(opts, core.WithObserver(observers(sdktrace.AlwaysSample())...))
	case IdemqBatchSampled:
		opts = append(opts, core.WithObserver(observers(sdktrace.TraceIDRatioBased(0.1))...))
	}
	// IdemqBatch, its observed variants and the scenarios
	return append(opts, core.WithBatchSize(b), core.WithConcurrency(w)), shapeBatch, w + 2
}

// consumerFor builds the Consumer a configuration runs over src and store.
type consumerFor[T any] func(src driver.Source, store driver.Store[T]) (*core.Consumer[T], error)

// handlers is the consumerFor of the per-message handler h (core.New) or,
// when bh is set, of the batch handler bh (core.NewBatch), with opts.
func handlers[T any](opts []core.Option, h core.Handler[T], bh core.BatchHandler[T]) consumerFor[T] {
	return func(src driver.Source, store driver.Store[T]) (*core.Consumer[T], error) {
		if bh != nil {
			return core.NewBatch(src, store, bh, opts...)
		}
		return core.New(src, store, h, opts...)
	}
}

// runConsumer runs the Consumer that build makes over e's queue and the
// store at storeURL until ctx ends, and returns its counts. tune, if not
// nil, sees the store before the consumer starts.
func runConsumer[T any](ctx context.Context, e *runEnv, storeURL string, stages *stageTimer, build consumerFor[T], tune func(store any)) (*counts, error) {
	store, err := core.OpenStore[T](ctx, storeURL)
	if err != nil {
		return nil, err
	}
	if tune != nil {
		tune(store)
	}
	if c, ok := store.(io.Closer); ok {
		defer c.Close()
	}
	rawSrc, err := core.OpenSource(ctx, e.broker.sourceURL(e.queue, e.consumer))
	if err != nil {
		return nil, err
	}
	src := recording(rawSrc, stages.t)
	c, err := build(src, store)
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
	// A leased Consumer's own stages, where it ran any.
	for name, sum := range map[string]*atomic.Int64{"lease": &stages.lease, "external": &stages.external} {
		if d := time.Duration(sum.Load()); d > 0 {
			n.stages[name] = d
		}
	}
	return &n, err
}

// runIdemq runs an idemq configuration on Postgres: per-message handlers
// with one UPDATE each (postgres.Queue for IdemqQueue), or a set-based
// BatchHandler (one UPDATE … FROM unnest per batch, queued with
// postgres.Queue so that it goes with the COMMIT).
func (p *pgStore) runIdemq(ctx context.Context, e *runEnv, t *tracker, name string) (*counts, error) {
	stages := &stageTimer{t: t}
	opts, shape, conns := idemqOptions(e, t, name, stages)
	update := `UPDATE ` + e.accountsTable + ` SET balance_cents = balance_cents + $1 WHERE account = $2`
	var h core.Handler[pgx.Tx]
	var bh core.BatchHandler[pgx.Tx]
	switch shape {
	case shapeOne:
		h = func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
			var p payment
			if err := json.Unmarshal(m.Body, &p); err != nil {
				return core.Permanent(err)
			}
			_, err := tx.Exec(ctx, update, p.AmountCents, p.Account)
			return err
		}
	case shapeQueue:
		h = func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
			var p payment
			if err := json.Unmarshal(m.Body, &p); err != nil {
				return core.Permanent(err)
			}
			return postgres.Queue(ctx, tx, update, p.AmountCents, p.Account)
		}
	default:
		setUpdate := `UPDATE ` + e.accountsTable + ` a SET balance_cents = a.balance_cents + v.amt
FROM (SELECT unnest($1::text[]) AS acc, unnest($2::bigint[]) AS amt) v WHERE a.account = v.acc`
		bh = func(ctx context.Context, tx pgx.Tx, msgs []*core.Message) error {
			// Several messages of a batch may pay into one account: sum
			// per account first, one row each, sorted so concurrent
			// batches lock accounts in one order.
			accs, amts, err := coreSums(msgs)
			if err != nil {
				return err
			}
			// Queued, the UPDATE travels with the COMMIT: two round
			// trips per batch (BEGIN with the claim, UPDATE with COMMIT).
			return postgres.Queue(ctx, tx, setUpdate, accs, amts)
		}
	}
	return runConsumer(ctx, e, p.idemqStoreURL(e.dedupTable, conns), stages, handlers(opts, h, bh), nil)
}

// coreSums sums a batch's payments per account, accounts sorted.
func coreSums(msgs []*core.Message) ([]string, []int64, error) {
	pays := make(map[string]payment, len(msgs))
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		var p payment
		if err := json.Unmarshal(m.Body, &p); err != nil {
			return nil, nil, core.Permanent(err)
		}
		// Each message of a batch handler won its own claim; key by
		// position, not id, so none is folded into another.
		k := strconv.Itoa(i)
		pays[k], ids[i] = p, k
	}
	accs, amts := sumByAccount(ids, pays)
	return accs, amts, nil
}

// discardLogger is used when Config.Progress is nil.
var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))
