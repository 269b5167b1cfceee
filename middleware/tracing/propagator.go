package tracing

import (
	"context"
	"os"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// Propagator is W3C trace context and baggage: what InstallPropagator
// installs.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// InstallPropagator makes Propagator OpenTelemetry's global propagator,
// which idemq's publishers, the outbox and the tracing observer use unless
// told otherwise (the OpenTelemetry default propagates nothing), and
// returns ctx joined to the trace the process was started in: the
// TRACEPARENT, TRACESTATE and BAGGAGE environment variables, as
// OpenTelemetry's environment carrier sets them. Programs call it once at
// start-up, so the messages they publish carry traceparent.
func InstallPropagator(ctx context.Context) context.Context {
	otel.SetTextMapPropagator(Propagator)
	env := propagation.MapCarrier{}
	for header, variable := range map[string]string{"traceparent": "TRACEPARENT", "tracestate": "TRACESTATE", "baggage": "BAGGAGE"} {
		if v := os.Getenv(variable); v != "" {
			env[header] = v
		}
	}
	return Propagator.Extract(ctx, env)
}
