// Package tracing traces every idemq decision with OpenTelemetry, following
// the messaging semantic conventions: one CONSUMER span "process
// <destination>" per message, duplicates and dead letters included, with
// the decision as the idemq.decision attribute, and one span per batch for
// each of the store's begin, claim, flush and commit, linked to the
// process spans of the batch's messages. A Tracing is a core.Observer:
// install it with core.WithObserver.
//
// The producer's trace context is extracted from the message headers (AMQP
// headers, Kafka headers, SQS message attributes: every adapter renders
// them into core.Message.Headers). By default the process span links to it,
// as the conventions recommend for consumers; WithParentFromMessage makes it
// the parent instead.
package tracing

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver/option"
)

// ScopeName is the instrumentation scope of idemq's spans and metrics.
const ScopeName = "github.com/idemq/idemq"

// Attribute keys idemq adds; the conventions have no dedup attributes.
const (
	// DecisionKey holds the decision: processed, duplicate, retry, dead_letter.
	DecisionKey = attribute.Key("idemq.decision")
	// AttemptKey holds the delivery attempt, 1 on first delivery.
	AttemptKey = attribute.Key("idemq.attempt")
	// BatchSizeKey holds how many messages shared the transaction.
	BatchSizeKey = attribute.Key("idemq.batch.size")
	// RetryDelayKey holds a Retry's redelivery delay in seconds.
	RetryDelayKey = attribute.Key("idemq.retry.delay")
)

// Option configures New, which fails with an error naming the option when
// a value is invalid.
type Option func(*config) error

type config struct {
	tp         trace.TracerProvider
	prop       propagation.TextMapPropagator
	parent     bool
	stageSpans bool
}

// WithTracerProvider sets the TracerProvider. Default:
// otel.GetTracerProvider(). Must not be nil.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return set("WithTracerProvider", option.Present(tp), func(c *config) { c.tp = tp })
}

// WithPropagator sets how trace context is read from message headers.
// Default: otel.GetTextMapPropagator() (set it to W3C trace context +
// baggage with otel.SetTextMapPropagator, as most services do). Must not
// be nil.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return set("WithPropagator", option.Present(p), func(c *config) { c.prop = p })
}

// WithParentFromMessage makes the producer's span the parent of the process
// span, so producer and consumer share one trace. Default: the process span
// starts a trace of its own (or continues the caller's) and links to the
// producer's span, which the conventions recommend because a message may be
// processed long after, or many times.
func WithParentFromMessage() Option {
	return set("WithParentFromMessage", nil, func(c *config) { c.parent = true })
}

// WithoutStageSpans turns off the spans for the store's begin, claim, flush
// and commit. Default: on.
func WithoutStageSpans() Option {
	return set("WithoutStageSpans", nil, func(c *config) { c.stageSpans = false })
}

// set is an option that sets a field once its check passed.
func set(name string, check error, put func(*config)) Option {
	return option.Set("tracing", name, check, put)
}

// Tracing is a core.Observer (and core.StageObserver) that records one
// span per decision and one span per batch for each store stage. Install it with
// core.WithObserver(t).
type Tracing struct {
	cfg    config
	tracer trace.Tracer
	// last is the span name and start options of the destination seen
	// last: the same for every message of a source, so made once.
	last atomic.Pointer[destination]
	// linkLimit is how many links the TracerProvider keeps on a span, once
	// a stage span reported dropping some; -1 until then. A span given
	// more evicts the oldest one by one, each eviction moving every link
	// kept, so a stage span is given no more than the provider keeps.
	linkLimit atomic.Int64
}

// destination is what the process spans of one source's messages share.
type destination struct {
	system, source string
	name           string
	// start are the span kind and the attributes a sampler sees; a
	// message with a producer to link adds its link to a copy.
	start []trace.SpanStartOption
}

// destinationOf returns the span name and start attributes of m's source.
func (t *Tracing) destinationOf(m *core.Message) *destination {
	sys := system(m)
	if d := t.last.Load(); d != nil && d.system == sys && d.source == m.Source {
		return d
	}
	d := &destination{system: sys, source: m.Source, name: spanName(m),
		start: []trace.SpanStartOption{consumerKind, trace.WithAttributes(semconv.MessagingSystemKey.String(sys),
			semconv.MessagingOperationTypeProcess, semconv.MessagingDestinationName(m.Source))}}
	t.last.Store(d)
	return d
}

// attrSlices recycles the lists of attributes a span is given at its end:
// the span copies them.
var attrSlices = sync.Pool{New: func() any { s := make([]attribute.KeyValue, 0, 24); return &s }}

// New returns a Tracing with the given options, or the error of an option
// given an invalid value.
func New(opts ...Option) (*Tracing, error) {
	cfg := config{stageSpans: true}
	if err := option.Apply(&cfg, opts...); err != nil {
		return nil, err
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	if cfg.prop == nil {
		cfg.prop = otel.GetTextMapPropagator()
	}
	t := &Tracing{cfg: cfg, tracer: cfg.tp.Tracer(ScopeName)}
	t.linkLimit.Store(-1)
	return t, nil
}

// StartDecision implements core.Observer: it starts the message's process
// span, linked to (or, with WithParentFromMessage, a child of) the
// producer's span, and returns ctx carrying it.
func (t *Tracing) StartDecision(ctx context.Context, m *core.Message) context.Context {
	// A sampler sees the attributes that say what is consumed where (made
	// once per source); the rest are built at the end, in one list, only
	// for a span that records.
	d := t.destinationOf(m)
	opts := d.start
	if m.Headers != nil {
		producer := trace.SpanContextFromContext(t.cfg.prop.Extract(context.Background(), propagation.MapCarrier(m.Headers)))
		if producer.IsValid() {
			if t.cfg.parent {
				ctx = trace.ContextWithRemoteSpanContext(ctx, producer)
			} else {
				opts = append(opts[:len(opts):len(opts)], trace.WithLinks(trace.Link{SpanContext: producer}))
			}
		}
	}
	ctx, _ = t.tracer.Start(ctx, d.name, opts...)
	return ctx
}

// EndDecision implements core.Observer: it records the message's details
// and the decision (and for Retry and DeadLetter the cause) on the process
// span and ends it.
func (t *Tracing) EndDecision(ctx context.Context, m *core.Message, out core.Outcome) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		span.End()
		return
	}
	p := attrSlices.Get().(*[]attribute.KeyValue)
	attrs := moreAttributes(ctx, m, (*p)[:0])
	attrs = append(attrs, DecisionKey.String(out.Decision.String()))
	switch out.Decision {
	case core.Retry, core.DeadLetter:
		attrs = append(attrs, semconv.ErrorTypeKey.String(ErrorType(out.Err)))
		if out.Decision == core.Retry {
			attrs = append(attrs, RetryDelayKey.Float64(out.Delay.Seconds()))
		}
		if out.Err != nil {
			span.RecordError(out.Err)
			span.SetStatus(codes.Error, out.Err.Error())
		} else {
			span.SetStatus(codes.Error, out.Decision.String())
		}
	}
	span.SetAttributes(attrs...)
	span.End()
	clear(attrs)
	*p = attrs[:0]
	attrSlices.Put(p)
}

// The span kinds as options, made once: made per span, each is one more
// allocation per message and stage.
var (
	consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)
	clientKind   = trace.WithSpanKind(trace.SpanKindClient)
)

// StartStage implements core.StageObserver: for the store's begin, claim,
// flush and commit (and a leased Consumer's lease, external, fence and
// release) it starts one span for the whole batch, a child of the first
// recorded message's process span and linked to every recorded message's
// process span (the first included), so each message's trace reaches its
// batch's stages at the cost of three spans a batch, not three a message.
// A batch larger than the TracerProvider's link limit links to as many of
// its recorded messages as the provider keeps: the first ones, once a
// span showed the limit by dropping links.
// It returns ctx carrying the span, so a database tracer (pgx's, for one)
// parents the statements under it. The handlers stage gets no span: the
// handler's own spans are children of the process span.
func (t *Tracing) StartStage(ctx context.Context, s core.Stage) context.Context {
	if !t.cfg.stageSpans || s.Name == core.StageHandlers || len(s.Contexts) == 0 {
		return ctx
	}
	var parent context.Context
	var p *[]trace.Link
	var links []trace.Link
	limit := int(t.linkLimit.Load())
	for _, mctx := range s.Contexts {
		// A process span that is not recorded (not sampled) gets no stage
		// span or link: under the SDK's parent-based sampling a child
		// would not be recorded either.
		sp := trace.SpanFromContext(mctx)
		if !sp.IsRecording() {
			continue
		}
		if parent == nil {
			parent = mctx
			if len(s.Contexts) == 1 {
				break
			}
			p = linkSlices.Get().(*[]trace.Link)
			links = (*p)[:0]
		}
		if limit >= 0 && len(links) >= limit {
			break
		}
		links = append(links, trace.Link{SpanContext: sp.SpanContext()})
	}
	if parent == nil {
		return ctx
	}
	opts := []trace.SpanStartOption{clientKind, trace.WithAttributes(BatchSizeKey.Int(len(s.Contexts)))}
	if len(links) > 0 {
		opts = append(opts, trace.WithLinks(links...))
	}
	_, span := t.tracer.Start(parent, "idemq "+string(s.Name), opts...)
	if p != nil {
		if limit < 0 {
			t.learnLinkLimit(span, len(links))
		}
		// The span copied the links.
		clear(links)
		*p = links[:0]
		linkSlices.Put(p)
	}
	return context.WithValue(trace.ContextWithSpan(ctx, span), stageSpanKey{}, span)
}

// linkSlices recycles the lists of links a stage span starts with: the
// span copies them.
var linkSlices = sync.Pool{New: func() any { s := make([]trace.Link, 0, 256); return &s }}

// learnLinkLimit notes how many links span kept of the n it was given, if
// it says it dropped some (the SDK's spans say so).
func (t *Tracing) learnLinkLimit(span trace.Span, n int) {
	if s, ok := span.(interface{ DroppedLinks() int }); ok {
		if dropped := s.DroppedLinks(); dropped > 0 {
			t.linkLimit.Store(int64(max(n-dropped, 0)))
		}
	}
}

// stageSpanKey marks the span StartStage started, so that EndStage ends
// that one and never a span ctx carried before.
type stageSpanKey struct{}

// EndStage implements core.StageObserver: it ends the stage's span,
// recording the error on it.
func (t *Tracing) EndStage(ctx context.Context, s core.Stage, err error) {
	span, ok := ctx.Value(stageSpanKey{}).(trace.Span)
	if !ok {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(string(s.Name)))
	}
	span.End()
}

func spanName(m *core.Message) string {
	if m.Source == "" {
		return "process"
	}
	return "process " + m.Source
}

// MessageAttributes returns the messaging semantic-convention attributes of
// m, plus idemq.attempt, plus every detail the source gave in m.Metadata:
// a broker's (partition, offset, routing key, delivery tag, queue URL) and
// the webhook source's (http.request.method, url.path, client.address,
// webhook.profile) alike, each as the kind of value the source gave
// (offsets and delivery tags as integers).
func MessageAttributes(ctx context.Context, m *core.Message) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 16)
	attrs = append(attrs,
		semconv.MessagingSystemKey.String(system(m)),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingDestinationName(m.Source),
	)
	return moreAttributes(ctx, m, attrs)
}

// moreAttributes appends to attrs those of MessageAttributes that
// StartDecision does not give the sampler.
func moreAttributes(ctx context.Context, m *core.Message, attrs []attribute.KeyValue) []attribute.KeyValue {
	attrs = append(attrs,
		semconv.MessagingOperationName("process"),
		semconv.MessagingMessageBodySize(len(m.Body)),
		AttemptKey.Int(m.Attempt),
	)
	if m.ID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(truncate(m.ID)))
	}
	if name := core.ConsumerName(ctx); name != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(name))
	}
	if m.Key != "" && m.System == "kafka" {
		attrs = append(attrs, semconv.MessagingKafkaMessageKey(truncate(m.Key)))
	}
	if m.Metadata == nil {
		return attrs
	}
	for k, v := range m.Metadata.All() {
		if k != "" {
			attrs = append(attrs, attributeOf(k, v))
		}
	}
	return attrs
}

// attributeOf is a metadata value as an attribute of its own kind; what
// OpenTelemetry has no kind for (a time, a group) as its text.
func attributeOf(k string, v slog.Value) attribute.KeyValue {
	switch v.Kind() {
	case slog.KindInt64:
		return attribute.Int64(k, v.Int64())
	case slog.KindUint64:
		if n := v.Uint64(); n <= math.MaxInt64 {
			return attribute.Int64(k, int64(n))
		}
	case slog.KindBool:
		return attribute.Bool(k, v.Bool())
	case slog.KindFloat64:
		return attribute.Float64(k, v.Float64())
	case slog.KindDuration:
		return attribute.Float64(k, v.Duration().Seconds())
	}
	return attribute.String(k, truncate(v.String()))
}

func system(m *core.Message) string {
	if m.System == "" {
		return "unknown"
	}
	return m.System
}

// ErrorType returns a low-cardinality class for a decision's cause, for the
// error.type attribute: the pipeline stage that failed ("handler", "claim",
// "commit", "id", "fingerprint", …) or "_OTHER".
func ErrorType(err error) string {
	var de *core.DecisionError
	if errors.As(err, &de) && de.Stage != "" {
		return string(de.Stage)
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// truncate keeps hostile ids and keys from bloating spans.
func truncate(s string) string {
	const limit = 256
	if len(s) <= limit {
		return s
	}
	return strings.ToValidUTF8(s[:limit], "")
}
