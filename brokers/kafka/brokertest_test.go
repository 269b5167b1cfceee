package kafka

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
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
			var cuts sync.Map // *Source → its *cutter
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
					cut := &cutter{}
					all := append(fastGroup(t), WithTopic(topic), WithGroup(group), cut.option())
					s, err := Open(context.Background(), bs, append(all, opts...)...)
					if err != nil {
						t.Fatalf("Open: %v", err)
					}
					cuts.Store(s, cut)
					return s
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					var out []brokertest.DeadLetter
					for _, r := range readAll(t, bs, topic+".dlq") {
						out = append(out, brokertest.DeadLetter{ID: r.headers[DefaultIDHeader], Body: r.value, Cause: r.headers[driver.CauseHeader]})
					}
					return out, nil
				},
				Reconnect: func(t *testing.T, src driver.Source) {
					cut, _ := cuts.Load(src)
					partitionsFlap(t, src.(*Source), cut.(*cutter))
				},
				NewPublisher: func(t *testing.T) driver.Publisher {
					p, err := NewPublisher(context.Background(), bs, WithTopic(topic))
					if err != nil {
						t.Fatalf("NewPublisher: %v", err)
					}
					return p
				},
				Raw: func(ctx context.Context) (brokertest.RawMessage, error) {
					return takeRaw(ctx, t, bs, topic, group)
				},
				SourceURL:    fmt.Sprintf("kafka://%s/%s?%s", bs, topic, q.Encode()),
				PublisherURL: fmt.Sprintf("kafka://%s/%s", bs, topic),
			}
		},
	}
}

// partitionsFlap cuts src's connections and refuses its dials until its
// session timed out, as a network failure would, and returns once src
// owns every partition again in its next membership: the group dropped the
// member, which lost its partitions, rejoined and got them back, so the
// messages it held are stale.
func partitionsFlap(t *testing.T, src *Source, cut *cutter) {
	t.Helper()
	before := src.Stats()
	src.mu.Lock()
	parts := int64(len(src.parts))
	src.mu.Unlock()
	cut.kill()
	time.Sleep(src.cfg.sessionTimeout * 3 / 2) // the session's end is the behaviour under test
	cut.revive()
	servicetest.WaitFor(t, 30*time.Second, "the source to get its partitions back", func() bool {
		st := src.Stats()
		return st.Revoked >= before.Revoked+parts && st.Assigned >= before.Assigned+parts
	})
}

// takeRaw takes the next message off topic as a plain franz-go group
// member of group would: it reads it and commits past it, so group's
// consumers do not get it again.
func takeRaw(ctx context.Context, t *testing.T, bs, topic, group string) (brokertest.RawMessage, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(bs), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(2*time.Second), kgo.HeartbeatInterval(50*time.Millisecond),
		kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		return brokertest.RawMessage{}, err
	}
	defer cl.Close()
	fs := cl.PollRecords(ctx, 1)
	if err := fs.Err0(); err != nil {
		return brokertest.RawMessage{}, err
	}
	r := fs.Records()[0]
	if err := cl.CommitRecords(ctx, r); err != nil {
		return brokertest.RawMessage{}, err
	}
	raw := brokertest.RawMessage{Key: string(r.Key), Body: r.Value, Headers: map[string]string{}}
	for _, h := range r.Headers {
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
// messages than the topic has partitions.)
func TestConformanceRetryTopic(t *testing.T) {
	brokertest.Run(t, harness(true, WithOrdering(OrderNone)))
}
