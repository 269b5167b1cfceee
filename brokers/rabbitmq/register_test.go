package rabbitmq

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/tracing"
)

// Opened by URL through core, the publisher injects the producer's trace
// context and the source hands it back in Message.Headers.
func TestOpenByURLCarriesTraceContext(t *testing.T) {
	base := amqpURL(t)
	if strings.Contains(base, "?") {
		t.Skip("IDEMQ_AMQP_URL with parameters is not supported by this test")
	}
	u := strings.TrimSuffix(base, "/") + "/?queue=" + uniqueQueue(t, base)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, err := core.OpenSource(ctx, u) // declares the queue
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	pub, err := core.OpenPublisher(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	otel.SetTextMapPropagator(propagation.TraceContext{})
	tp := sdktrace.NewTracerProvider()
	pctx, span := tp.Tracer("test").Start(ctx, "send")
	if err := pub.Publish(pctx, "", &core.Message{ID: "traced-1", Key: "customer-7", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	span.End()
	d, err := brokertest.StartReceiver(t, src, 0).Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Ack(ctx)
	m := d.Message()
	if m.ID != "traced-1" || m.Key != "customer-7" {
		t.Fatalf("id %q key %q, want traced-1 and customer-7", m.ID, m.Key)
	}
	want := span.SpanContext().TraceID().String()
	if tp := m.Headers["traceparent"]; !strings.Contains(tp, want) {
		t.Errorf("traceparent header %q does not carry trace %s", tp, want)
	}
	// The tracing observer links the process span to the producer's.
	rec := tracetest.NewSpanRecorder()
	ctp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr, err := tracing.New(tracing.WithTracerProvider(ctp), tracing.WithPropagator(propagation.TraceContext{}))
	if err != nil {
		t.Fatal(err)
	}
	cm := &core.Message{ID: m.ID, Body: m.Body, Headers: m.Headers, Key: m.Key, Source: m.Source,
		System: m.System, Attempt: m.Attempt, Metadata: m.Metadata, ReceivedAt: m.ReceivedAt}
	tr.EndDecision(tr.StartDecision(ctx, cm), cm, core.Outcome{Decision: core.Processed})
	if ended := rec.Ended(); len(ended) != 1 || len(ended[0].Links()) != 1 || ended[0].Links()[0].SpanContext.SpanID() != span.SpanContext().SpanID() {
		t.Errorf("consumer span does not link to the producer span")
	} else if v := attrValue(ended[0], "messaging.system"); v != "rabbitmq" {
		t.Errorf("messaging.system = %q", v)
	}
	if _, err := core.OpenPublisher(ctx, strings.TrimSuffix(base, "/")+"/"); err == nil || !strings.Contains(err.Error(), "queue") {
		t.Errorf("publisher URL without queue: %v, want an error naming the parameter", err)
	}
}

func attrValue(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.Emit()
		}
	}
	return ""
}
