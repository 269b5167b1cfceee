// Package metrics counts and times every idemq decision with OpenTelemetry
// metrics: the messaging conventions' messaging.process.duration and
// messaging.client.consumed.messages, each with the decision as the
// idemq.decision attribute, plus a gauge of messages in flight, a
// histogram of batch sizes and one of how long each store stage of a
// transaction (claim, handlers, commit, …) takes.
package metrics

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/option"
	"github.com/idemq/idemq/middleware/tracing"
)

// Instrument names idemq adds to the conventions' own.
const (
	// InFlightName is an up-down counter of messages received and not yet
	// decided.
	InFlightName = "idemq.messages.in_flight"
	// BatchSizeName is a histogram of how many messages shared one claim.
	BatchSizeName = "idemq.batch.size"
	// StageDurationName is a histogram, in seconds, of how long each store
	// stage of a transaction took (begin, claim, handlers, flush, commit,
	// and a leased Consumer's lease, fence, external and release), with
	// the stage as StageKey and error.type when the stage failed.
	StageDurationName = "idemq.stage.duration"
)

// StageKey holds the store stage StageDurationName times: a
// core.StageName.
const StageKey = attribute.Key("idemq.stage")

// Option configures New, which fails with an error naming the option when
// a value is invalid.
type Option func(*config) error

type config struct{ mp metric.MeterProvider }

// WithMeterProvider sets the MeterProvider. Default: otel.GetMeterProvider().
// Must not be nil.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return option.Set("metrics", "WithMeterProvider", option.Present(mp), func(c *config) { c.mp = mp })
}

// Metrics is a core.Observer (and core.StageObserver) recording idemq's
// metrics. Install it with core.WithObserver(m).
type Metrics struct {
	duration  messagingconv.ProcessDuration
	consumed  messagingconv.ClientConsumedMessages
	inFlight  metric.Int64UpDownCounter
	batchSize metric.Int64Histogram
	stageDur  metric.Float64Histogram
	// attrSets caches the attribute sets of each (system, destination,
	// consumer[, decision or stage, error type]): building one sorts and
	// allocates on every measurement, and there are few distinct ones.
	attrSets sync.Map
	cachedN  atomic.Int64
}

// New creates the instruments. It fails when an option is given an
// invalid value, or the MeterProvider refuses them.
func New(opts ...Option) (*Metrics, error) {
	var cfg config
	if err := option.Apply(&cfg, opts...); err != nil {
		return nil, err
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	meter := cfg.mp.Meter(tracing.ScopeName)
	var m Metrics
	var err error
	// The SDK's default buckets are for milliseconds; the duration is in
	// seconds: these are the messaging conventions' advice.
	if m.duration, err = messagingconv.NewProcessDuration(meter, metric.WithExplicitBucketBoundaries(
		0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)); err != nil {
		return nil, err
	}
	if m.consumed, err = messagingconv.NewClientConsumedMessages(meter); err != nil {
		return nil, err
	}
	if m.inFlight, err = meter.Int64UpDownCounter(InFlightName, metric.WithUnit("{message}"),
		metric.WithDescription("Messages received by idemq and not yet decided.")); err != nil {
		return nil, err
	}
	if m.batchSize, err = meter.Int64Histogram(BatchSizeName, metric.WithUnit("{message}"),
		metric.WithDescription("Messages claimed together in one transaction."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)); err != nil {
		return nil, err
	}
	// A commit or claim takes from a fraction of a millisecond (SQLite, a
	// local Postgres) to seconds (a cluster under failover).
	if m.stageDur, err = meter.Float64Histogram(StageDurationName, metric.WithUnit("s"),
		metric.WithDescription("How long a store stage of an idemq transaction took."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)); err != nil {
		return nil, err
	}
	return &m, nil
}

type decisionKey struct{}

// decisionCtx is the context StartDecision returns: the caller's context
// carrying what EndDecision needs. Being the context and the value at
// once, it costs one allocation per message instead of two.
type decisionCtx struct {
	context.Context
	start time.Time
	sys   string
	gauge *gaugeOpts
}

// Value returns the decisionCtx itself for decisionKey.
func (d *decisionCtx) Value(key any) any {
	if key == (decisionKey{}) {
		return d
	}
	return d.Context.Value(key)
}

// gaugeOpts are the cached options of the in-flight gauge's changes.
type gaugeOpts struct{ add []metric.AddOption }

// endOpts are the cached options of a decision's measurements: built
// once per attribute set, so recording boxes and allocates nothing.
type endOpts struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

// StartDecision implements core.Observer: it counts the message in flight
// and notes when its decision began.
func (m *Metrics) StartDecision(ctx context.Context, msg *core.Message) context.Context {
	sys := systemOf(msg)
	k := cacheKey{kind: "gauge", sys: sys, dest: msg.Source, consumer: core.ConsumerName(ctx)}
	gauge, ok := m.load(k).(*gaugeOpts)
	if !ok {
		gauge = &gaugeOpts{add: []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(append(baseAttrs(k),
			semconv.MessagingSystemKey.String(sys))...))}}
		m.store(k, gauge)
	}
	m.inFlight.Add(ctx, 1, gauge.add...)
	return &decisionCtx{Context: ctx, start: time.Now(), sys: sys, gauge: gauge}
}

// EndDecision implements core.Observer: it records the decision's
// duration and counts it, with the decision (and for Retry and DeadLetter
// the error type) as attributes.
func (m *Metrics) EndDecision(ctx context.Context, msg *core.Message, out core.Outcome) {
	ds, ok := ctx.Value(decisionKey{}).(*decisionCtx)
	if !ok {
		return
	}
	m.inFlight.Add(ctx, -1, ds.gauge.add...)
	k := cacheKey{kind: "end", sys: ds.sys, dest: msg.Source, consumer: core.ConsumerName(ctx), decision: out.Decision.String()}
	if out.Decision == core.Retry || out.Decision == core.DeadLetter {
		k.errType = tracing.ErrorType(out.Err)
	}
	opts, ok := m.load(k).(*endOpts)
	if !ok {
		attrs := append(baseAttrs(k), tracing.DecisionKey.String(k.decision),
			semconv.MessagingOperationName("process"), semconv.MessagingSystemKey.String(k.sys))
		if k.errType != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(k.errType))
		}
		set := metric.WithAttributeSet(attribute.NewSet(attrs...))
		opts = &endOpts{add: []metric.AddOption{set}, record: []metric.RecordOption{set}}
		m.store(k, opts)
	}
	// The instruments themselves, not the conventions' RecordSet/AddSet
	// wrappers, which box the attribute set into a new option every call.
	m.duration.Inst().Record(ctx, time.Since(ds.start).Seconds(), opts.record...)
	m.consumed.Inst().Add(ctx, 1, opts.add...)
}

// baseAttrs are the destination and consumer group of k.
func baseAttrs(k cacheKey) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs, semconv.MessagingDestinationName(k.dest))
	if k.consumer != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(k.consumer))
	}
	return attrs
}

type stageKey struct{}

// stageCtx is the context StartStage returns: the stage's context
// carrying when the stage began, in one allocation.
type stageCtx struct {
	context.Context
	start time.Time
}

// Value returns the stageCtx itself for stageKey.
func (s *stageCtx) Value(key any) any {
	if key == (stageKey{}) {
		return s
	}
	return s.Context.Value(key)
}

// StartStage implements core.StageObserver: it records the batch size of
// each claim and notes when the stage began.
func (m *Metrics) StartStage(ctx context.Context, s core.Stage) context.Context {
	if s.Name == core.StageClaim && len(s.Messages) > 0 {
		m.batchSize.Record(ctx, int64(len(s.Messages)))
	}
	return &stageCtx{Context: ctx, start: time.Now()}
}

// EndStage implements core.StageObserver: it records the stage's
// duration, with the stage's name, the first message's system and
// destination, the consumer, and the error type when it failed.
func (m *Metrics) EndStage(ctx context.Context, s core.Stage, err error) {
	st, ok := ctx.Value(stageKey{}).(*stageCtx)
	if !ok {
		return
	}
	k := cacheKey{kind: "stage", sys: "unknown", consumer: core.ConsumerName(ctx), stage: string(s.Name)}
	if len(s.Messages) > 0 {
		k.sys, k.dest = systemOf(s.Messages[0]), s.Messages[0].Source
	}
	if err != nil {
		k.errType = tracing.ErrorType(err)
	}
	opts, ok := m.load(k).([]metric.RecordOption)
	if !ok {
		attrs := append(baseAttrs(k), StageKey.String(k.stage), semconv.MessagingSystemKey.String(k.sys))
		if k.errType != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(k.errType))
		}
		opts = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
		m.store(k, opts)
	}
	m.stageDur.Record(ctx, time.Since(st.start).Seconds(), opts...)
}

// maxCached bounds the attribute cache: destinations and consumers are
// few, but a cache must not grow without bound if they are not.
const maxCached = 4096

type cacheKey struct{ kind, sys, dest, consumer, decision, stage, errType string }

func (m *Metrics) load(k cacheKey) any {
	v, _ := m.attrSets.Load(k)
	return v
}

func (m *Metrics) store(k cacheKey, v any) {
	if m.cachedN.Load() >= maxCached {
		return
	}
	if _, loaded := m.attrSets.LoadOrStore(k, v); !loaded {
		m.cachedN.Add(1)
	}
}

func systemOf(m *core.Message) string {
	if m.System == "" {
		return "unknown"
	}
	return m.System
}
