package tracing_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/middleware/tracing"
)

func TestInstallPropagatorSendsTraceparentAndJoinsTheProcessTrace(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	t.Setenv("TRACEPARENT", tp)
	t.Setenv("BAGGAGE", "tenant=acme")

	ctx := tracing.InstallPropagator(context.Background())
	sc := trace.SpanContextFromContext(ctx)
	if sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || !sc.IsRemote() {
		t.Fatalf("the process trace from TRACEPARENT was not joined: %v", sc)
	}
	h := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, h)
	if h["traceparent"] == "" || h["baggage"] != "tenant=acme" {
		t.Fatalf("the global propagator injected %v, want traceparent and baggage", h)
	}
}
