package tracing

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/core"
)

// FuzzHeaderCarrier: whatever trace headers a producer sends (traceparent,
// tracestate, baggage, any bytes), the middleware ends exactly one process
// span per message with the decision on it, and a span context taken from
// the headers is used only when it is valid.
func FuzzHeaderCarrier(f *testing.F) {
	f.Add("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "vendor=x", "k=v", "pay-1", true)
	f.Add("00-zzzz-!!-01", "=,=;;", "k=v,,,==", "\x00", false)
	f.Add("ff-00000000000000000000000000000000-0000000000000000-00", "", "%zz", "", true)
	f.Fuzz(func(t *testing.T, traceparent, tracestate, baggage, id string, asParent bool) {
		rec := tracetest.NewSpanRecorder()
		opts := []Option{
			WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))),
			WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
		}
		if asParent {
			opts = append(opts, WithParentFromMessage())
		}
		tr, err := New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		m := &core.Message{ID: id, Source: "q", System: "rabbitmq", Attempt: 1, Headers: map[string]string{
			"traceparent": traceparent, "tracestate": tracestate, "baggage": baggage,
		}}
		tr.EndDecision(tr.StartDecision(context.Background(), m), m, core.Outcome{Decision: core.Processed})
		ended := rec.Ended()
		producer := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(m.Headers)))
		if asParent && producer.IsValid() && !producer.IsSampled() {
			// Found by this target: as the parent, a producer's
			// "not sampled" flag turns the consumer span off (the default
			// ParentBased sampler). That is W3C semantics, and the reason
			// linking (the default) is the mode for untrusted producers.
			if len(ended) != 0 {
				t.Fatalf("%d spans under an unsampled parent", len(ended))
			}
			return
		}
		if len(ended) != 1 {
			t.Fatalf("%d spans ended, want 1", len(ended))
		}
		for _, l := range ended[0].Links() {
			if !l.SpanContext.IsValid() {
				t.Fatalf("link to an invalid span context %v", l.SpanContext)
			}
		}
		if p := ended[0].Parent(); p.IsValid() && !asParent {
			t.Fatalf("parent %v set without WithParentFromMessage", p)
		}
	})
}
