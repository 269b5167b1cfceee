package tracing_test

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/middleware/metrics"
	"github.com/idemq/idemq/middleware/tracing"
)

// BenchmarkObserverCalls calls the observers as a Consumer does for
// batches of 200 messages (start each decision, the begin, claim,
// handlers and commit stages, end each decision), with no broker or store
// around them, on the real OpenTelemetry SDK: what observing costs per
// message, alone. The messages carry a broker's metadata and, in the
// "-traceparent" variants, the producer's trace context.
//
//	go test -run '^$' -bench ObserverCalls -benchmem ./middleware/tracing
func BenchmarkObserverCalls(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer tp.Shutdown(context.Background())
	sampled := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()),
		sdktrace.WithSampler(sdktrace.TraceIDRatioBased(0.1)))
	defer sampled.Shutdown(context.Background())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	met, err := metrics.New(metrics.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	tr, err := tracing.New(tracing.WithTracerProvider(tp), tracing.WithPropagator(prop))
	if err != nil {
		b.Fatal(err)
	}
	sampledTr, err := tracing.New(tracing.WithTracerProvider(sampled), tracing.WithPropagator(prop))
	if err != nil {
		b.Fatal(err)
	}
	for _, v := range []struct {
		name        string
		obs         []core.Observer
		traceparent bool
	}{
		{"tracing-metrics", []core.Observer{tr, met}, false},
		{"tracing-metrics-traceparent", []core.Observer{tr, met}, true},
		{"tracing", []core.Observer{tr}, false},
		{"tracing-sampled-10pct", []core.Observer{sampledTr}, false},
		{"metrics", []core.Observer{met}, false},
	} {
		b.Run(v.name, func(b *testing.B) { runObserverCalls(b, v.obs, v.traceparent) })
	}
}

func runObserverCalls(b *testing.B, obs []core.Observer, traceparent bool) {
	const batch = 200
	producer := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled})
	msgs := make([]*core.Message, batch)
	for i := range msgs {
		h := map[string]string{"idemq-ts": "1"}
		if traceparent {
			h["traceparent"] = "00-" + producer.TraceID().String() + "-" + producer.SpanID().String() + "-01"
		}
		msgs[i] = &core.Message{ID: "pay-" + strconv.Itoa(i), Body: []byte(`{"account":"acc-17","amount_cents":1250}`),
			Source: "payments", System: "rabbitmq", Attempt: 1, Headers: h,
			Metadata: driver.MetadataMap{
				"messaging.rabbitmq.destination.routing_key":  slog.StringValue("payments"),
				"messaging.rabbitmq.message.delivery_tag":     slog.Uint64Value(uint64(i + 1)),
				"messaging.rabbitmq.message.redelivered_flag": slog.BoolValue(false),
			}}
	}
	base := core.ContextWithConsumerName(context.Background(), "billing")
	var stageObs []core.StageObserver
	for _, o := range obs {
		if so, ok := o.(core.StageObserver); ok {
			stageObs = append(stageObs, so)
		}
	}
	ctxs := make([][]context.Context, batch)
	for i := range ctxs {
		ctxs[i] = make([]context.Context, len(obs))
	}
	last := make([]context.Context, batch)
	stage := func(name core.StageName) {
		s := core.Stage{Name: name, Messages: msgs, Contexts: last}
		sctxs := make([]context.Context, len(stageObs))
		ctx := base
		for i, o := range stageObs {
			ctx = o.StartStage(ctx, s)
			sctxs[i] = ctx
		}
		for i := len(stageObs) - 1; i >= 0; i-- {
			stageObs[i].EndStage(sctxs[i], s, nil)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n += batch {
		for i, m := range msgs {
			ctx := base
			for j, o := range obs {
				ctx = o.StartDecision(ctx, m)
				ctxs[i][j] = ctx
			}
			last[i] = ctx
		}
		for _, name := range []core.StageName{core.StageBegin, core.StageClaim, core.StageHandlers, core.StageCommit} {
			stage(name)
		}
		for i, m := range msgs {
			for j := len(obs) - 1; j >= 0; j-- {
				obs[j].EndDecision(ctxs[i][j], m, core.Outcome{Decision: core.Processed})
			}
		}
	}
}
