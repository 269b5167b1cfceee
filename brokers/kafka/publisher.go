package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemq/idemq/core/driver"
)

// Publisher produces core Messages to Kafka with franz-go's idempotent
// producer and acks=all, for tests, examples and the outbox relay. Keyed
// records land on the partition Java producers choose (murmur2), keyless
// ones on each partition in turn. It is safe for concurrent use.
type Publisher struct {
	cfg       config
	cl        *kgo.Client
	connected atomic.Bool // a broker answered
}

// NewPublisher returns a Publisher for addr, a kafka:// URL (whose path is
// the default topic; the consumer's parameters are checked and ignored) or
// a broker list. It connects at the first Publish, which fails at once
// when no broker answers (a refused TLS handshake or SASL login); later
// Publishes ride out broker trouble until their context ends.
func NewPublisher(_ context.Context, addr string, opts ...PublisherOption) (*Publisher, error) {
	cfg, err := newConfig(addr, opts)
	if err != nil {
		return nil, err
	}
	logger := cmp.Or(cfg.logger, slog.Default())
	cl, err := kgo.NewClient(append(cfg.kgoOpts(func() *slog.Logger { return logger }), kgo.RecordPartitioner(partitioner{}))...)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	return &Publisher{cfg: cfg, cl: cl}, nil
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
	rs := make([]*kgo.Record, len(msgs))
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
		rs[i] = &kgo.Record{Topic: topic, Value: m.Body, Partition: -1, Headers: make([]kgo.RecordHeader, 0, len(headers))}
		for _, k := range slices.Sorted(maps.Keys(headers)) {
			rs[i].Headers = append(rs[i].Headers, kgo.RecordHeader{Key: k, Value: []byte(headers[k])})
		}
		if m.Key != "" {
			rs[i].Key = []byte(m.Key)
		}
	}
	if !p.connected.Load() {
		if err := p.cfg.probe(ctx, p.cl); err != nil {
			return fmt.Errorf("kafka: Publish to %q: %w", topic, err)
		}
		p.connected.Store(true)
	}
	results := p.cl.ProduceSync(ctx, rs...)
	if results.FirstErr() == nil {
		return nil
	}
	// franz-go may cut a call's records into several produce requests,
	// so the broker can take some and refuse others: each message gets
	// its own result (results come in the order of the broker's answers).
	at := make(map[*kgo.Record]int, len(rs))
	for i, r := range rs {
		at[r] = i
	}
	errs := make([]error, len(rs))
	failed, tooLarge := 0, 0
	var first error
	for _, r := range results {
		if r.Err == nil {
			continue
		}
		failed++
		first = cmp.Or(first, r.Err)
		err := fmt.Errorf("kafka: Publish to %q: %w", topic, p.cfg.explain(r.Err))
		if errors.Is(r.Err, kerr.MessageTooLarge) {
			tooLarge++
			err = driver.Permanent(err)
		}
		errs[at[r.Record]] = err
	}
	if failed < len(msgs) {
		return &driver.Partial{Errs: errs}
	}
	err := fmt.Errorf("kafka: Publish to %q: %d of %d messages failed: %w", topic, failed, len(msgs), p.cfg.explain(first))
	if tooLarge == failed {
		return driver.Permanent(err)
	}
	return err
}

// Close flushes and closes the producer.
func (p *Publisher) Close() error {
	p.cl.Close()
	return nil
}

// partitioner places a record on its Partition when the topic has it (a
// redriven dead letter's origin), else by key as Java producers do
// (murmur2), else on each partition in turn.
type partitioner struct{}

func (partitioner) ForTopic(t string) kgo.TopicPartitioner {
	return &topicPartitioner{keyed: kgo.StickyKeyPartitioner(nil).ForTopic(t)}
}

type topicPartitioner struct {
	keyed kgo.TopicPartitioner
	next  int // called for one record at a time
}

func (*topicPartitioner) RequiresConsistency(*kgo.Record) bool { return true }

func (p *topicPartitioner) Partition(r *kgo.Record, n int) int {
	switch {
	case r.Partition >= 0 && int(r.Partition) < n:
		return int(r.Partition)
	case r.Key != nil:
		return p.keyed.Partition(r, n)
	}
	p.next = (p.next + 1) % n
	return p.next
}
