package core_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/logging"
	"github.com/idemq/idemq/middleware/metrics"
	"github.com/idemq/idemq/middleware/tracing"
)

// BenchmarkFrameworkCostObserved is BenchmarkFrameworkCost at batch 200
// with the shipped observers on the real OpenTelemetry SDK: a
// TracerProvider sampling every span and batching them to a no-op
// exporter, a MeterProvider with a manual reader, and logging at info to
// io.Discard (processed decisions are below the level, as in production).
// Compare with BenchmarkFrameworkCost/batch200 in the same run.
//
//	go test -run '^$' -bench 'FrameworkCost' -benchmem ./core/
func BenchmarkFrameworkCostObserved(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer tp.Shutdown(context.Background())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	met, err := metrics.New(metrics.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	sampled := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()),
		sdktrace.WithSampler(sdktrace.TraceIDRatioBased(0.1)))
	defer sampled.Shutdown(context.Background())
	tr, err := tracing.New(tracing.WithTracerProvider(tp))
	if err != nil {
		b.Fatal(err)
	}
	noStages, err := tracing.New(tracing.WithTracerProvider(tp), tracing.WithoutStageSpans())
	if err != nil {
		b.Fatal(err)
	}
	sampledTr, err := tracing.New(tracing.WithTracerProvider(sampled))
	if err != nil {
		b.Fatal(err)
	}
	logs, err := logging.New(slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		b.Fatal(err)
	}
	batch := core.WithBatchSize(200)
	for _, v := range []struct {
		name string
		obs  []core.Observer
	}{
		{"batch200-tracing-metrics-logging", []core.Observer{tr, met, logs}},
		{"batch200-tracing", []core.Observer{tr}},
		{"batch200-tracing-no-stage-spans", []core.Observer{noStages}},
		{"batch200-tracing-sampled-10pct", []core.Observer{sampledTr}},
		{"batch200-metrics", []core.Observer{met}},
		{"batch200-logging", []core.Observer{logs}},
	} {
		b.Run(v.name, func(b *testing.B) { core.RunFrameworkCost(b, batch, core.WithObserver(v.obs...)) })
	}
}
