package tracing_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/drain"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/tracing"
	"github.com/idemq/idemq/stores/sqlite"
)

var prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// consumeTraced publishes msgs inside a producer span, then consumes them
// with tracing installed and returns the producer's span context and all
// ended spans.
func consumeTraced(t *testing.T, batch int, opts []tracing.Option, msgs ...*core.Message) (trace.SpanContext, []sdktrace.ReadOnlySpan) {
	t.Helper()
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(ctx)

	b, err := memory.NewBroker()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// The memory broker's Publish injects the producer's context into the
	// headers with the global propagator, as every idemq publisher does.
	otel.SetTextMapPropagator(prop)
	pctx, producer := tp.Tracer("producer").Start(ctx, "send q", trace.WithSpanKind(trace.SpanKindProducer))
	if err := core.NewPublisher(b).Publish(pctx, "q", msgs...); err != nil {
		t.Fatal(err)
	}
	producer.End()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	tr, err := tracing.New(append([]tracing.Option{tracing.WithTracerProvider(tp), tracing.WithPropagator(prop)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if string(m.Body) == "poison" {
			return core.Permanent(errors.New("poison body"))
		}
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = drain.Drain(dctx, b, "q", func(sub *memory.Subscription) (*core.Consumer[*sql.Tx], error) {
		return core.New[*sql.Tx](sub, store, h, core.WithObserver(tr), core.WithName("billing"), core.WithBatchSize(batch),
			core.WithLinger(50*time.Millisecond), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	})
	if err != nil {
		t.Fatal(err)
	}
	return producer.SpanContext(), rec.Ended()
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

func processSpans(spans []sdktrace.ReadOnlySpan) map[string]sdktrace.ReadOnlySpan {
	out := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		if s.Name() == "process q" {
			id, _ := attr(s, "messaging.message.id")
			body, _ := attr(s, "messaging.message.body.size")
			out[id.AsString()+"/"+body.Emit()] = s
		}
	}
	return out
}

func TestEveryDecisionGetsASpanLinkedToTheProducer(t *testing.T) {
	producer, spans := consumeTraced(t, 4, nil,
		&core.Message{ID: "a", Body: []byte("1")},
		&core.Message{ID: "a", Body: []byte("1")},
		&core.Message{ID: "b", Body: []byte("poison")},
		&core.Message{ID: "", Body: []byte("no id")})
	var decisions []string
	for _, s := range spans {
		if s.Name() != "process q" {
			continue
		}
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span kind %v, want consumer", s.SpanKind())
		}
		d, _ := attr(s, tracing.DecisionKey)
		decisions = append(decisions, d.AsString())
		for k, want := range map[attribute.Key]string{
			"messaging.system": "memory", "messaging.operation.type": "process", "messaging.operation.name": "process",
			"messaging.destination.name": "q", "messaging.consumer.group.name": "billing",
		} {
			if v, _ := attr(s, k); v.AsString() != want {
				t.Errorf("%s = %q, want %q", k, v.AsString(), want)
			}
		}
		if v, ok := attr(s, tracing.AttemptKey); !ok || v.AsInt64() != 1 {
			t.Errorf("idemq.attempt = %v", v)
		}
		if len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID() != producer.SpanID() {
			t.Errorf("links %v, want one to the producer span %v", s.Links(), producer.SpanID())
		}
		if s.Parent().TraceID() == producer.TraceID() {
			t.Error("by default the producer must be linked, not the parent")
		}
		switch d.AsString() {
		case "processed", "duplicate":
			if s.Status().Code == codes.Error {
				t.Errorf("%s span has error status", d.AsString())
			}
		case "dead_letter":
			et, _ := attr(s, "error.type")
			if s.Status().Code != codes.Error || len(s.Events()) == 0 || (et.AsString() != "handler" && et.AsString() != "id") {
				t.Errorf("dead-letter span: status %v, events %d, error.type %q", s.Status(), len(s.Events()), et.AsString())
			}
		}
	}
	count := map[string]int{}
	for _, d := range decisions {
		count[d]++
	}
	if count["processed"] != 1 || count["duplicate"] != 1 || count["dead_letter"] != 2 {
		t.Errorf("decisions %v, want 1 processed, 1 duplicate, 2 dead_letter", count)
	}
}

func TestStageSpansAreChildrenOfEachProcessSpan(t *testing.T) {
	_, spans := consumeTraced(t, 1, nil, &core.Message{ID: "x", Body: []byte("1")})
	var process sdktrace.ReadOnlySpan
	stages := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		switch s.Name() {
		case "process q":
			process = s
		case "idemq begin", "idemq claim", "idemq commit":
			stages[s.Name()] = s
		}
	}
	if process == nil || len(stages) != 3 {
		t.Fatalf("process span %v, stage spans %v", process != nil, len(stages))
	}
	for name, s := range stages {
		if s.Parent().SpanID() != process.SpanContext().SpanID() {
			t.Errorf("%s is not a child of the process span", name)
		}
	}
}

func TestParentFromMessageOption(t *testing.T) {
	producer, spans := consumeTraced(t, 1, []tracing.Option{tracing.WithParentFromMessage()}, &core.Message{ID: "x", Body: []byte("1")})
	ps := processSpans(spans)
	if len(ps) != 1 {
		t.Fatalf("%d process spans", len(ps))
	}
	for _, s := range ps {
		if s.Parent().SpanID() != producer.SpanID() || s.SpanContext().TraceID() != producer.TraceID() {
			t.Errorf("parent %v / trace %v, want the producer's %v / %v", s.Parent().SpanID(), s.SpanContext().TraceID(), producer.SpanID(), producer.TraceID())
		}
		if len(s.Links()) != 0 {
			t.Errorf("links %v, want none when the producer is the parent", s.Links())
		}
	}
}

// In a batch every message keeps its own span and its own link, and the
// batch's stages are one span each, linked to every message's span.
func TestBatchedMessagesKeepTheirOwnSpans(t *testing.T) {
	_, spans := consumeTraced(t, 10, nil,
		&core.Message{ID: "1", Body: []byte("a")}, &core.Message{ID: "2", Body: []byte("b")}, &core.Message{ID: "3", Body: []byte("c")})
	ps := processSpans(spans)
	if len(ps) != 3 {
		t.Fatalf("%d process spans, want 3", len(ps))
	}
	seen := map[trace.SpanID]bool{}
	for _, s := range ps {
		if seen[s.SpanContext().SpanID()] {
			t.Error("two messages share a span")
		}
		seen[s.SpanContext().SpanID()] = true
		if len(s.Links()) != 1 {
			t.Errorf("span has %d links", len(s.Links()))
		}
		if v, _ := attr(s, tracing.DecisionKey); v.AsString() != "processed" {
			t.Errorf("decision %q", v.AsString())
		}
	}
	// One span per stage of the batch: a child of one process span,
	// linked to each.
	stages := map[string]int{}
	for _, s := range spans {
		switch s.Name() {
		case "idemq begin", "idemq claim", "idemq commit":
		default:
			continue
		}
		stages[s.Name()]++
		if v, _ := attr(s, tracing.BatchSizeKey); v.AsInt64() != 3 {
			t.Errorf("%s batch size %d, want 3", s.Name(), v.AsInt64())
		}
		linked := map[trace.SpanID]bool{}
		for _, l := range s.Links() {
			linked[l.SpanContext.SpanID()] = true
		}
		for _, p := range ps {
			if !linked[p.SpanContext().SpanID()] {
				t.Errorf("%s does not link to process span %v", s.Name(), p.SpanContext().SpanID())
			}
		}
		if !seen[s.Parent().SpanID()] {
			t.Errorf("%s is not a child of a process span", s.Name())
		}
	}
	for _, name := range []string{"idemq begin", "idemq claim", "idemq commit"} {
		if stages[name] != 1 {
			t.Errorf("%d %q spans, want one for the batch", stages[name], name)
		}
	}
}

func TestMalformedTraceHeadersAreIgnored(t *testing.T) {
	m := &core.Message{ID: "x", Body: []byte("1"), Headers: map[string]string{"traceparent": "00-zzzz-not-a-trace-01"}}
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr, err := tracing.New(tracing.WithTracerProvider(tp), tracing.WithPropagator(prop))
	if err != nil {
		t.Fatal(err)
	}
	tr.EndDecision(tr.StartDecision(ctx, m), m, core.Outcome{Decision: core.Processed})
	if len(rec.Ended()) != 1 || len(rec.Ended()[0].Links()) != 0 {
		t.Errorf("spans %d, want 1 without links", len(rec.Ended()))
	}
}

// A leased consumer's steps are spans under the message's process span:
// the lease, the External call (whose own client spans are its children),
// the fence and the completion's commit.
func TestLeasedStagesAreTraced(t *testing.T) {
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(ctx)
	b, err := memory.NewBroker()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := core.NewPublisher(b).Publish(ctx, "q", &core.Message{ID: "pay-1", Body: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	tr, err := tracing.New(tracing.WithTracerProvider(tp), tracing.WithPropagator(prop))
	if err != nil {
		t.Fatal(err)
	}
	h := core.LeasedHandler[*sql.Tx, string]{
		External: func(ctx context.Context, m *core.Message) (string, error) {
			_, span := tp.Tracer("http").Start(ctx, "POST /charges", trace.WithSpanKind(trace.SpanKindClient))
			span.End()
			return "ch_1", nil
		},
		Complete: func(context.Context, *sql.Tx, *core.Message, string) error { return nil },
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := drain.Drain(dctx, b, "q", func(sub *memory.Subscription) (*core.Consumer[*sql.Tx], error) {
		return core.NewLeased(sub, store, h, core.WithObserver(tr), core.WithName("billing"),
			core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	}); err != nil {
		t.Fatal(err)
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
	}
	process := byName["process q"]
	if process == nil {
		t.Fatal("no process span")
	}
	for _, name := range []string{"idemq lease", "idemq external", "idemq fence", "idemq commit"} {
		s := byName[name]
		if s == nil {
			t.Errorf("no %q span", name)
			continue
		}
		if s.Parent().SpanID() != process.SpanContext().SpanID() {
			t.Errorf("%s is not a child of the process span", name)
		}
	}
	if call, ext := byName["POST /charges"], byName["idemq external"]; call == nil || ext == nil || call.Parent().SpanID() != ext.SpanContext().SpanID() {
		t.Error("the External call's own span is not a child of the idemq external span")
	}
}

func TestBadOptionsAreNamed(t *testing.T) {
	for name, o := range map[string]tracing.Option{
		"WithTracerProvider": tracing.WithTracerProvider(nil),
		"WithPropagator":     tracing.WithPropagator(nil),
	} {
		if _, err := tracing.New(o); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %v does not name it", name, err)
		}
	}
}

// A stage span is given no more links than the TracerProvider keeps, once
// a span showed how many that is: the first recorded messages' process
// spans, its parent's first.
func TestStageSpansKeepTheProvidersLinkLimit(t *testing.T) {
	ctx := core.ContextWithConsumerName(context.Background(), "billing")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec),
		sdktrace.WithRawSpanLimits(sdktrace.SpanLimits{LinkCountLimit: 2, AttributeCountLimit: -1, EventCountLimit: -1,
			AttributeValueLengthLimit: -1, AttributePerEventCountLimit: -1, AttributePerLinkCountLimit: -1}))
	tr, err := tracing.New(tracing.WithTracerProvider(tp), tracing.WithPropagator(prop))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var s core.Stage
		for i := range 5 {
			m := &core.Message{ID: "m" + string(rune('a'+i)), Body: []byte("1"), Source: "q", System: "memory"}
			s.Messages = append(s.Messages, m)
			s.Contexts = append(s.Contexts, tr.StartDecision(ctx, m))
		}
		for _, name := range []core.StageName{core.StageBegin, core.StageClaim, core.StageCommit} {
			s.Name = name
			tr.EndStage(tr.StartStage(ctx, s), s, nil)
		}
		for i, m := range s.Messages {
			tr.EndDecision(s.Contexts[i], m, core.Outcome{Decision: core.Processed})
		}
	}
	var stages int
	for _, s := range rec.Ended() {
		if !strings.HasPrefix(s.Name(), "idemq ") {
			continue
		}
		stages++
		if len(s.Links()) != 2 {
			t.Errorf("%s has %d links, want the provider's limit, 2", s.Name(), len(s.Links()))
		}
		if stages > 1 && (len(s.Links()) == 0 || s.Links()[0].SpanContext.SpanID() != s.Parent().SpanID()) {
			t.Errorf("%s does not link to its parent first: links %v, parent %v", s.Name(), s.Links(), s.Parent().SpanID())
		}
	}
	if stages != 6 {
		t.Errorf("%d stage spans, want 6", stages)
	}
}
