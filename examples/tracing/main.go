// Command tracing prints idemq's OpenTelemetry spans to stdout: a producer
// span, then one "process" span per delivery — a processed message, its
// duplicate and a dead letter — each linked to the producer, with child
// spans for the store's begin, claim and commit.
//
//	go run ./examples/tracing
//
// To see the same traces in Jaeger, run `docker compose up -d jaeger` and
// swap the stdout exporter for otlptracegrpc pointed at localhost:4317.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/idemq/idemq/internal/drain"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/logging"
	"github.com/idemq/idemq/middleware/tracing"
	"github.com/idemq/idemq/stores/sqlite"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "tracing:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	exp, err := stdouttrace.New(stdouttrace.WithPrettyPrint(), stdouttrace.WithWriter(out))
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(ctx)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	dir, err := os.MkdirTemp("", "idemq-tracing")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		return err
	}
	defer store.Close()
	broker, err := memory.NewBroker()
	if err != nil {
		return err
	}
	defer broker.Close()

	// The producer's span context travels in the message headers.
	pctx, span := tp.Tracer("producer").Start(ctx, "send orders", trace.WithSpanKind(trace.SpanKindProducer))
	msgs := []*core.Message{
		{ID: "order-1", Body: []byte("ok")},
		{ID: "order-1", Body: []byte("ok")}, // a duplicate
		{ID: "order-2", Body: []byte("poison")},
	}
	for _, m := range msgs {
		m.Headers = map[string]string{}
		otel.GetTextMapPropagator().Inject(pctx, propagation.MapCarrier(m.Headers))
	}
	if err := core.NewPublisher(broker).Publish(pctx, "orders", msgs...); err != nil {
		return err
	}
	span.End()

	handler := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if string(m.Body) == "poison" {
			return core.Permanent(errors.New("cannot ship to a closed account"))
		}
		return nil
	}
	tr, err := tracing.New()
	if err != nil {
		return err
	}
	logs, err := logging.New(nil)
	if err != nil {
		return err
	}
	_, err = drain.Drain(ctx, broker, "orders", func(sub *memory.Subscription) (*core.Consumer[*sql.Tx], error) {
		return core.New[*sql.Tx](sub, store, handler,
			core.WithName("shipping"), core.WithObserver(tr, logs),
			core.WithShutdownTimeout(5*time.Second))
	})
	return err
}
