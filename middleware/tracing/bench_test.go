package tracing_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/idemq/idemq/internal/drain"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/logging"
	"github.com/idemq/idemq/middleware/metrics"
	"github.com/idemq/idemq/middleware/tracing"
	"github.com/idemq/idemq/stores/sqlite"
)

// BenchmarkObserverCost runs the same pipeline (memory broker, SQLite,
// batches of 100) bare and with each observer, so their added cost per
// message reads as a ratio against "bare" in one run:
//
//	go test -run '^$' -bench ObserverCost -count 5 ./middleware/tracing
func BenchmarkObserverCost(b *testing.B) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer tp.Shutdown(context.Background())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	met, err := metrics.New(metrics.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	tr, err := tracing.New(tracing.WithTracerProvider(tp))
	if err != nil {
		b.Fatal(err)
	}
	logs, err := logging.New(quiet)
	if err != nil {
		b.Fatal(err)
	}
	all := []core.Option{core.WithObserver(tr, met, logs)}
	for _, tc := range []struct {
		name string
		opts []core.Option
	}{
		{"bare", nil},
		{"logging", []core.Option{core.WithObserver(logs)}},
		{"metrics", []core.Option{core.WithObserver(met)}},
		{"tracing", []core.Option{core.WithObserver(tr)}},
		{"all", all},
	} {
		b.Run(tc.name, func(b *testing.B) { benchPipeline(b, tc.opts) })
	}
}

func benchPipeline(b *testing.B, opts []core.Option) {
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "db"))
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	broker, err := memory.NewBroker()
	if err != nil {
		b.Fatal(err)
	}
	defer broker.Close()
	msgs := make([]*core.Message, b.N)
	for i := range msgs {
		msgs[i] = &core.Message{ID: fmt.Sprintf("m-%d", i), Body: []byte(`{"amount":1}`)}
	}
	if err := core.NewPublisher(broker).Publish(ctx, "q", msgs...); err != nil {
		b.Fatal(err)
	}
	h := func(context.Context, *sql.Tx, *core.Message) error { return nil }
	b.ResetTimer()
	res, err := drain.Drain(ctx, broker, "q", func(sub *memory.Subscription) (*core.Consumer[*sql.Tx], error) {
		return core.New[*sql.Tx](sub, store, h, append([]core.Option{core.WithName("bench"), core.WithBatchSize(100),
			core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)...)
	})
	b.StopTimer()
	if err != nil || res.Processed != int64(b.N) {
		b.Fatalf("processed %d of %d: %v", res.Processed, b.N, err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
