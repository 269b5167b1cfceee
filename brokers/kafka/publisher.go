package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"

	kafkago "github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemq/idemq/core/driver"
)

// Publisher produces core Messages to Kafka with acks=all, for tests,
// examples and the outbox relay. It is safe for concurrent use.
type Publisher struct {
	cfg config
	w   *kafkago.Writer
}

// NewPublisher returns a Publisher for addr, a kafka:// URL (whose path is
// the default topic; the consumer's parameters are checked and ignored) or
// a broker list. It connects at the first Publish.
func NewPublisher(_ context.Context, addr string, opts ...PublisherOption) (*Publisher, error) {
	cfg, err := newConfig(addr, opts)
	if err != nil {
		return nil, err
	}
	// Java's partitioner: keys land where Java producers put them.
	w := cfg.newWriter(&kafkago.Murmur2Balancer{}, cmp.Or(cfg.logger, slog.Default()))
	w.BatchSize = 1000
	return &Publisher{cfg: cfg, w: w}, nil
}

// Publish produces msgs to topic ("" for the default topic) and waits for
// all of them. ID goes to the id header (none when empty), Key to the Kafka
// key (messages of a key keep their order), Headers to Kafka headers, with
// the trace context of ctx. A call that fails only because records are too
// large (MESSAGE_TOO_LARGE) fails with an error marked driver.Permanent: the
// same records fail the same way, though fewer at a time may pass.
func (p *Publisher) Publish(ctx context.Context, topic string, msgs ...*driver.Message) error {
	topic = cmp.Or(topic, p.cfg.topic)
	if err := checkTopic(topic); err != nil {
		return fmt.Errorf("kafka: Publish: topic: %w", err)
	}
	if len(msgs) == 0 {
		return nil
	}
	out := make([]kafkago.Message, len(msgs))
	for i, m := range msgs {
		if m == nil {
			return fmt.Errorf("kafka: Publish: message %d is nil", i)
		}
		headers := make(map[string]string, len(m.Headers)+3)
		maps.Copy(headers, m.Headers)
		otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(headers))
		delete(headers, p.cfg.idHeader)
		if m.ID != "" {
			headers[p.cfg.idHeader] = m.ID
		}
		out[i] = kafkago.Message{Topic: topic, Value: m.Body, Headers: appendHeaders(nil, headers)}
		if m.Key != "" {
			out[i].Key = []byte(m.Key)
		}
	}
	if err := p.w.WriteMessages(ctx, out...); err != nil {
		var werrs kafkago.WriteErrors
		if errors.As(err, &werrs) {
			err = fmt.Errorf("kafka: Publish to %q: %d of %d messages failed: %w", topic, werrs.Count(), len(msgs), err)
		} else {
			err = fmt.Errorf("kafka: Publish to %q: %w", topic, p.cfg.explain(err))
		}
		if tooLarge(werrs, err) {
			return driver.Permanent(err)
		}
		return err
	}
	return nil
}

// tooLarge reports whether every failed message of werrs (when the writer
// returned them), or else err, is MESSAGE_TOO_LARGE: the broker's answer or
// the writer's own refusal of a message over its batch bytes.
func tooLarge(werrs kafkago.WriteErrors, err error) bool {
	if werrs == nil {
		return errors.Is(err, kafkago.MessageSizeTooLarge)
	}
	failed := false
	for _, e := range werrs {
		if e != nil && !errors.Is(e, kafkago.MessageSizeTooLarge) {
			return false
		}
		failed = failed || e != nil
	}
	return failed
}

// Close flushes and closes the writer.
func (p *Publisher) Close() error { return closeConns(nil, p.w) }
