package kafka

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
)

// harness runs the conformance suite with the given Source options; every
// fixture gets its own kfake cluster (or topic on IDEMQ_KAFKA_URL), topic
// of four partitions and group.
func harness(retryTopic bool, opts ...Option) brokertest.Harness {
	return brokertest.Harness{
		RecordsCause:        true,
		OperatesDeadLetters: true,
		CarriesKey:          true,
		Open: func(t *testing.T) *brokertest.Fixture {
			bs := brokers(t)
			topic := newTopic(t, bs, 4)
			q := url.Values{}
			if retryTopic {
				createTopics(t, bs, 2, topic+".retry")
				opts = append(opts, WithRetryTopic(topic+".retry"))
				q.Set("retry_topic", topic+".retry")
			}
			group := "idemq-test-" + randomHex(4)
			q.Set("group", group)
			pub, err := NewPublisher(context.Background(), bs)
			if err != nil {
				t.Fatalf("NewPublisher: %v", err)
			}
			t.Cleanup(func() { pub.Close() })
			return &brokertest.Fixture{
				Publish: func(ctx context.Context, msgs ...*driver.Message) error {
					return pub.Publish(ctx, topic, msgs...)
				},
				NewSource: func(t *testing.T) driver.Source {
					all := append(fastGroup(t), WithTopic(topic), WithGroup(group))
					s, err := Open(context.Background(), bs, append(all, opts...)...)
					if err != nil {
						t.Fatalf("Open: %v", err)
					}
					return s
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					var out []brokertest.DeadLetter
					for _, r := range readAll(t, bs, topic+".dlq", 1) {
						out = append(out, brokertest.DeadLetter{ID: r.headers[DefaultIDHeader], Body: r.value, Cause: r.headers[driver.CauseHeader]})
					}
					return out, nil
				},
				Reconnect: func(t *testing.T, src driver.Source) { forceRebalance(t, bs, src.(*Source)) },
				NewPublisher: func(t *testing.T) driver.Publisher {
					p, err := NewPublisher(context.Background(), bs, WithTopic(topic))
					if err != nil {
						t.Fatalf("NewPublisher: %v", err)
					}
					return p
				},
				Raw: func(ctx context.Context) (brokertest.RawMessage, error) {
					return takeRaw(ctx, bs, topic, group)
				},
				SourceURL:    fmt.Sprintf("kafka://%s/%s?%s", bs, topic, q.Encode()),
				PublisherURL: fmt.Sprintf("kafka://%s/%s", bs, topic),
			}
		},
	}
}

// forceRebalance makes a second member join src's group, which revokes
// src's partitions (its unsettled deliveries go stale once the revoke
// timeout passes), and leave again; it returns once src owns every
// partition of a generation after that member left.
func forceRebalance(t *testing.T, bs string, src *Source) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cg, err := kafkago.NewConsumerGroup(kafkago.ConsumerGroupConfig{
		ID:                src.cfg.group,
		Brokers:           strings.Split(bs, ","),
		Topics:            src.topics(),
		HeartbeatInterval: 50 * time.Millisecond,
		SessionTimeout:    2 * time.Second,
		RebalanceTimeout:  4 * time.Second,
		JoinGroupBackoff:  100 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("second member: %v", err)
	}
	gen, err := cg.Next(ctx)
	if err != nil {
		cg.Close()
		t.Fatalf("second member joining: %v", err)
	}
	joined := gen.ID
	if err := cg.Close(); err != nil { // leaves the group
		t.Logf("second member leaving: %v", err)
	}
	want := 0
	for _, as := range gen.Assignments {
		want += len(as)
	}
	for {
		src.mu.Lock()
		g := src.gen
		ok := g != nil && !g.revoked && g.kgen.ID > joined && len(g.parts) >= want
		src.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the source did not get its partitions back after the second member left")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// takeRaw takes the next message off topic as kafka-go's own group reader
// in group would: it reads it and commits past it, so group's consumers
// do not get it again.
func takeRaw(ctx context.Context, bs, topic, group string) (brokertest.RawMessage, error) {
	r := kafkago.NewReader(kafkago.ReaderConfig{
		Brokers:           strings.Split(bs, ","),
		GroupID:           group,
		Topic:             topic,
		StartOffset:       kafkago.FirstOffset,
		MaxWait:           50 * time.Millisecond,
		HeartbeatInterval: 50 * time.Millisecond,
		SessionTimeout:    2 * time.Second,
		ErrorLogger:       kafkago.LoggerFunc(func(string, ...any) {}),
	})
	defer r.Close()
	m, err := r.FetchMessage(ctx)
	if err != nil {
		return brokertest.RawMessage{}, err
	}
	if err := r.CommitMessages(ctx, m); err != nil {
		return brokertest.RawMessage{}, err
	}
	raw := brokertest.RawMessage{Key: string(m.Key), Body: m.Value, Headers: map[string]string{}}
	for _, h := range m.Headers {
		raw.Headers[h.Key] = string(h.Value)
	}
	raw.ID = raw.Headers[DefaultIDHeader]
	return raw, nil
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, harness(false))
}

// The suite again with retries through a retry topic and no ordering.
// (OrderPerPartition cannot run the suite: its cases hold more unsettled
// deliveries than the topic has partitions.)
func TestConformanceRetryTopic(t *testing.T) {
	brokertest.Run(t, harness(true, WithOrdering(OrderNone)))
}
