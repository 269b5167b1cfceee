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
	"github.com/idemq/idemq/core/driver/option"
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
//
// The in-flight gauge and the consumed-messages counter are observable
// instruments: a decision adds to a counter kept for its attribute set,
// which the MeterProvider reads when it collects, so counting a message
// takes no synchronous measurement (and records no exemplar). Durations
// are histograms, recorded per decision and per stage.
type Metrics struct {
	duration  metric.Float64Histogram
	inFlight  metric.Int64ObservableUpDownCounter
	consumed  metric.Int64ObservableCounter
	batchSize metric.Int64Histogram
	stageDur  metric.Float64Histogram
	// last is the source of the message seen last: the same for every
	// message a consumer receives from one destination, so looked up once.
	last atomic.Pointer[source]
	// mu serializes making sources, decisions' measurements and counters;
	// using them takes no lock.
	mu sync.Mutex
	// cache holds the sources and the stages' record options by
	// (system, destination, consumer[, stage, error type]): building an
	// attribute set sorts and allocates, and there are few distinct ones.
	cache   sync.Map
	cachedN atomic.Int64
	// inFlightN and consumedN are what the observable instruments report.
	inFlightN, consumedN atomic.Pointer[[]*counter]
	// overflowIn and overflowOut count, under the conventions'
	// otel.metric.overflow set, the messages whose attribute sets found
	// the cache full; they report once overflowed is set.
	overflowIn, overflowOut *counter
	overflowed              atomic.Bool
}

// counter is one attribute set's count for an observable instrument.
type counter struct {
	n   atomic.Int64
	set []metric.ObserveOption
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
	m := new(Metrics)
	// The SDK's default buckets are for milliseconds; the duration is in
	// seconds: these are the messaging conventions' advice.
	duration, err := messagingconv.NewProcessDuration(meter, metric.WithExplicitBucketBoundaries(
		0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	if err != nil {
		return nil, err
	}
	// The instrument itself, not the conventions' RecordSet wrapper, which
	// boxes the attribute set into a new option every call.
	m.duration = duration.Inst()
	consumed, err := messagingconv.NewClientConsumedMessagesObservable(meter)
	if err != nil {
		return nil, err
	}
	m.consumed = consumed.Inst()
	if m.inFlight, err = meter.Int64ObservableUpDownCounter(InFlightName, metric.WithUnit("{message}"),
		metric.WithDescription("Messages received by idemq and not yet decided.")); err != nil {
		return nil, err
	}
	if _, err = meter.RegisterCallback(m.observe, m.inFlight, m.consumed); err != nil {
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
	overflow := attribute.NewSet(attribute.Bool("otel.metric.overflow", true))
	m.overflowIn, m.overflowOut = m.counter(&m.inFlightN, overflow), m.counter(&m.consumedN, overflow)
	return m, nil
}

// observe reports the counters to the observable instruments, the
// overflow ones once the cache overflowed.
func (m *Metrics) observe(_ context.Context, o metric.Observer) error {
	overflowed := m.overflowed.Load()
	for _, c := range *m.inFlightN.Load() {
		if c != m.overflowIn || overflowed {
			o.ObserveInt64(m.inFlight, c.n.Load(), c.set...)
		}
	}
	for _, c := range *m.consumedN.Load() {
		if c != m.overflowOut || overflowed {
			o.ObserveInt64(m.consumed, c.n.Load(), c.set...)
		}
	}
	return nil
}

// counter adds a counter of set to those *all holds and returns it. The
// caller holds m.mu, or is New.
func (m *Metrics) counter(all *atomic.Pointer[[]*counter], set attribute.Set) *counter {
	c := &counter{set: []metric.ObserveOption{metric.WithAttributeSet(set)}}
	var cs []*counter
	if p := all.Load(); p != nil {
		cs = *p
	}
	// A new slice each time: observe reads the old one without the lock.
	cs = append(cs[:len(cs):len(cs)], c)
	all.Store(&cs)
	return c
}

// source is what the measurements of one (system, destination, consumer)
// share: its in-flight counter and, made on first use, the measurements
// of each decision.
type source struct {
	sys, dest, consumer string
	inFlight            *counter
	// ends are the measurements of a decision without an error type, by
	// core.Decision; errEnds those with one, by endKey.
	ends    [core.DeadLetter + 1]atomic.Pointer[end]
	errEnds sync.Map
}

// end is what one decision's measurements take: its consumed counter and
// the duration's record options, made once per attribute set.
type end struct {
	consumed *counter
	record   []metric.RecordOption
}

type endKey struct {
	decision core.Decision
	errType  string
}

// sourceOf returns the source of msg consumed by consumer.
func (m *Metrics) sourceOf(msg *core.Message, consumer string) *source {
	sys := systemOf(msg)
	if s := m.last.Load(); s != nil && s.sys == sys && s.dest == msg.Source && s.consumer == consumer {
		return s
	}
	k := cacheKey{kind: "source", sys: sys, dest: msg.Source, consumer: consumer}
	s, ok := m.load(k).(*source)
	if !ok {
		m.mu.Lock()
		if s, ok = m.load(k).(*source); !ok {
			s = &source{sys: sys, dest: msg.Source, consumer: consumer, inFlight: m.overflowIn}
			if m.store(k, s) {
				set := attribute.NewSet(append(baseAttrs(msg.Source, consumer), semconv.MessagingSystemKey.String(sys))...)
				s.inFlight = m.counter(&m.inFlightN, set)
			} else {
				m.overflowed.Store(true)
			}
		}
		m.mu.Unlock()
	}
	m.last.Store(s)
	return s
}

// endOf returns the measurements of out's decision for a message of s.
func (m *Metrics) endOf(s *source, out core.Outcome) *end {
	k := endKey{decision: out.Decision}
	if out.Decision == core.Retry || out.Decision == core.DeadLetter {
		k.errType = tracing.ErrorType(out.Err)
	}
	if e := s.end(k); e != nil {
		return e
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := s.end(k); e != nil {
		return e
	}
	attrs := append(baseAttrs(s.dest, s.consumer), tracing.DecisionKey.String(out.Decision.String()),
		semconv.MessagingOperationName("process"), semconv.MessagingSystemKey.String(s.sys))
	if k.errType != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(k.errType))
	}
	set := attribute.NewSet(attrs...)
	e := &end{consumed: m.overflowOut, record: []metric.RecordOption{metric.WithAttributeSet(set)}}
	if !m.reserve() {
		m.overflowed.Store(true)
		return e
	}
	e.consumed = m.counter(&m.consumedN, set)
	if s.byDecision(k) {
		s.ends[k.decision].Store(e)
	} else {
		s.errEnds.Store(k, e)
	}
	return e
}

// byDecision reports whether k's measurements are kept in s.ends.
func (s *source) byDecision(k endKey) bool {
	return k.errType == "" && k.decision >= 0 && int(k.decision) < len(s.ends)
}

// end returns the measurements of k made before, or nil.
func (s *source) end(k endKey) *end {
	if s.byDecision(k) {
		return s.ends[k.decision].Load()
	}
	if e, ok := s.errEnds.Load(k); ok {
		return e.(*end)
	}
	return nil
}

type decisionKey struct{}

// decisionCtx is the context StartDecision returns: the caller's context
// carrying what EndDecision needs. Being the context and the value at
// once, it costs one allocation per message instead of two.
type decisionCtx struct {
	context.Context
	start time.Time
	src   *source
}

// Value returns the decisionCtx itself for decisionKey.
func (d *decisionCtx) Value(key any) any {
	if key == (decisionKey{}) {
		return d
	}
	return d.Context.Value(key)
}

// StartDecision implements core.Observer: it counts the message in flight
// and notes when its decision began.
func (m *Metrics) StartDecision(ctx context.Context, msg *core.Message) context.Context {
	s := m.sourceOf(msg, core.ConsumerName(ctx))
	s.inFlight.n.Add(1)
	return &decisionCtx{Context: ctx, start: time.Now(), src: s}
}

// EndDecision implements core.Observer: it records the decision's
// duration and counts it, with the decision (and for Retry and DeadLetter
// the error type) as attributes.
func (m *Metrics) EndDecision(ctx context.Context, _ *core.Message, out core.Outcome) {
	// The Consumer passes the context StartDecision returned; one that
	// wraps it is served through Value.
	ds, ok := ctx.(*decisionCtx)
	if !ok {
		if ds, ok = ctx.Value(decisionKey{}).(*decisionCtx); !ok {
			return
		}
	}
	ds.src.inFlight.n.Add(-1)
	e := m.endOf(ds.src, out)
	e.consumed.n.Add(1)
	m.duration.Record(ctx, time.Since(ds.start).Seconds(), e.record...)
}

// baseAttrs are the destination and the consumer group.
func baseAttrs(dest, consumer string) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs, semconv.MessagingDestinationName(dest))
	if consumer != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(consumer))
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
		attrs := append(baseAttrs(k.dest, k.consumer), StageKey.String(k.stage), semconv.MessagingSystemKey.String(k.sys))
		if k.errType != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(k.errType))
		}
		opts = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
		m.store(k, opts)
	}
	m.stageDur.Record(ctx, time.Since(st.start).Seconds(), opts...)
}

// maxCached bounds the cache: destinations and consumers are few, but a
// cache must not grow without bound if they are not.
const maxCached = 4096

type cacheKey struct{ kind, sys, dest, consumer, stage, errType string }

func (m *Metrics) load(k cacheKey) any {
	v, _ := m.cache.Load(k)
	return v
}

// store caches v under k and reports whether it did: not when the cache
// is full, or when k already has a value.
func (m *Metrics) store(k cacheKey, v any) bool {
	if !m.reserve() {
		return false
	}
	if _, loaded := m.cache.LoadOrStore(k, v); loaded {
		m.cachedN.Add(-1)
		return false
	}
	return true
}

// reserve takes one of the maxCached places, or reports that none is
// left.
func (m *Metrics) reserve() bool {
	if m.cachedN.Add(1) > maxCached {
		m.cachedN.Add(-1)
		return false
	}
	return true
}

func systemOf(m *core.Message) string {
	if m.System == "" {
		return "unknown"
	}
	return m.System
}
