// Package metrics counts and times every idemq decision with OpenTelemetry
// metrics: the messaging conventions' messaging.process.duration and
// messaging.client.consumed.messages, each with the decision as the
// idemq.decision attribute, plus a gauge of messages in flight and a
// histogram of batch sizes.
package metrics

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/tracing"
)

// Instrument names idemq adds to the conventions' own.
const (
	// InFlightName is an up-down counter of messages received and not yet
	// decided.
	InFlightName = "idemq.messages.in_flight"
	// BatchSizeName is a histogram of how many messages shared one claim.
	BatchSizeName = "idemq.batch.size"
)

// Option configures New.
type Option func(*config)

type config struct{ mp metric.MeterProvider }

// WithMeterProvider sets the MeterProvider. Default: otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// Metrics is decision middleware and a store-stage observer recording
// idemq's metrics. Install it with Options.
type Metrics struct {
	duration  messagingconv.ProcessDuration
	consumed  messagingconv.ClientConsumedMessages
	inFlight  metric.Int64UpDownCounter
	batchSize metric.Int64Histogram
}

// New creates the instruments. It fails only if the MeterProvider refuses
// them.
func New(opts ...Option) (*Metrics, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	meter := cfg.mp.Meter(tracing.ScopeName)
	var m Metrics
	var err error
	if m.duration, err = messagingconv.NewProcessDuration(meter); err != nil {
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
	return &m, nil
}

// Options returns the core options that install m.
func (m *Metrics) Options() []core.Option {
	return []core.Option{core.WithMiddleware(m.Middleware()), core.WithStageObserver(m)}
}

// Middleware returns the decision middleware that records each decision.
func (m *Metrics) Middleware() core.Middleware {
	return func(next core.ProcessFunc) core.ProcessFunc {
		return func(ctx context.Context, msg *core.Message) core.Outcome {
			sys := messagingconv.SystemAttr(systemOf(msg))
			attrs := make([]attribute.KeyValue, 0, 5)
			attrs = append(attrs, semconv.MessagingDestinationName(msg.Source))
			if name := core.ConsumerName(ctx); name != "" {
				attrs = append(attrs, semconv.MessagingConsumerGroupName(name))
			}
			gauge := metric.WithAttributes(append([]attribute.KeyValue{semconv.MessagingSystemKey.String(string(sys))}, attrs...)...)
			m.inFlight.Add(ctx, 1, gauge)
			start := time.Now()
			out := next(ctx, msg)
			m.inFlight.Add(ctx, -1, gauge)
			attrs = append(attrs, tracing.DecisionKey.String(out.Decision.String()))
			if out.Decision == core.Retry || out.Decision == core.DeadLetter {
				attrs = append(attrs, semconv.ErrorTypeKey.String(tracing.ErrorType(out.Err)))
			}
			m.duration.Record(ctx, time.Since(start).Seconds(), "process", sys, attrs...)
			m.consumed.Add(ctx, 1, "process", sys, attrs...)
			return out
		}
	}
}

// ObserveStage implements core.StageObserver: it records the batch size of
// each claim.
func (m *Metrics) ObserveStage(ctxs []context.Context, stage string) func(error) {
	if stage == "claim" && len(ctxs) > 0 {
		m.batchSize.Record(ctxs[0], int64(len(ctxs)))
	}
	return func(error) {}
}

func systemOf(m *core.Message) string {
	if m.System == "" {
		return "unknown"
	}
	return m.System
}
