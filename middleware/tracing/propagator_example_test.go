package tracing_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/middleware/tracing"
)

// A program installs the W3C propagator once at start-up; from then on the
// publishers, the outbox and the tracing observer carry traceparent, and a
// process started inside a trace (TRACEPARENT) continues it.
func ExampleInstallPropagator() {
	ctx := tracing.InstallPropagator(context.Background())

	// What a publisher does with each message's headers:
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	headers := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(trace.ContextWithSpanContext(ctx, sc), headers)
	fmt.Println(headers["traceparent"])
	// Output:
	// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}
