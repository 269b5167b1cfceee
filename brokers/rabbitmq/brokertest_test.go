package rabbitmq

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver/retry"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
)

// harness runs the conformance suite on RabbitMQ with the given Source
// options, which params (URL parameters) must repeat for the suite's URL
// openers; every fixture gets its own queues.
func harness(recordsCause bool, params string, opts ...Option) brokertest.Harness {
	return brokertest.Harness{
		RecordsCause:        recordsCause,
		OperatesDeadLetters: true,
		Open: func(t *testing.T) *brokertest.Fixture {
			url := amqpURL(t)
			q := uniqueQueue(t, url)
			ctx := context.Background()
			all := append([]Option{WithLogger(testLogger(t)), WithReconnectBackoff(50*time.Millisecond, time.Second)}, opts...)
			// Opening a Source declares the topology the publisher needs.
			s, err := Open(ctx, url, append([]Option{WithQueue(q)}, all...)...)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			cfg := s.cfg
			s.Close()
			if cfg.exchange != "" {
				t.Cleanup(func() { deleteExchangeIfUnused(url, cfg.exchange) })
			}
			// The fixture's Publisher and Source agree on the exchange and
			// id header, as two sides opened by one URL do.
			pubOpts := []PublisherOption{WithRoutingKey(q), WithPublishExchange(cfg.exchange)}
			if cfg.idHeader != "" {
				pubOpts = append(pubOpts, WithPublisherIDHeader(cfg.idHeader))
			}
			newPub := func(t *testing.T) *Publisher {
				p, err := NewPublisher(ctx, url, pubOpts...)
				if err != nil {
					t.Fatalf("NewPublisher: %v", err)
				}
				return p
			}
			pub := newPub(t)
			t.Cleanup(func() { pub.Close() })
			var sources atomic.Int64
			srcURL := strings.TrimSuffix(url, "/") + "/?queue=" + q + params
			return &brokertest.Fixture{
				Publish: func(ctx context.Context, msgs ...*driver.Message) error {
					return pub.Publish(ctx, "", msgs...)
				},
				NewSource: func(t *testing.T) driver.Source {
					// A connection name of its own, for Reconnect.
					name := WithConnectionName(fmt.Sprintf("idemq-bt-%s-%d", q, sources.Add(1)))
					s, err := Open(ctx, url, append(append([]Option{WithQueue(q)}, all...), name)...)
					if err != nil {
						t.Fatalf("Open: %v", err)
					}
					return s
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					var out []brokertest.DeadLetter
					for _, d := range drainQueue(t, url, q+".dlq") {
						cause, _ := d.Headers[driver.CauseHeader].(string)
						out = append(out, brokertest.DeadLetter{ID: d.MessageId, Body: d.Body, Cause: cause})
					}
					return out, nil
				},
				Reconnect: func(t *testing.T, src driver.Source) {
					needRabbitmqctl(t, url)
					s := src.(*Source)
					before := s.Stats().Reconnects
					if n := closeConnectionNamed(t, s.cfg.connName); n != 1 {
						t.Fatalf("found %d connections named %s, want 1", n, s.cfg.connName)
					}
					waitUntil(t, 10*time.Second, func() bool { return s.Stats().Reconnects > before })
				},
				NewPublisher: func(t *testing.T) driver.Publisher { return newPub(t) },
				Raw: func(ctx context.Context) (brokertest.RawMessage, error) {
					d, err := getOne(ctx, url, q)
					if err != nil {
						return brokertest.RawMessage{}, err
					}
					return brokertest.RawMessage{ID: d.MessageId, Headers: renderHeaders(d.Headers), Body: d.Body}, nil
				},
				SourceURL:    srcURL,
				PublisherURL: srcURL,
			}
		},
	}
}

// getOne takes the next message off queue with amqp091-go's basic.get
// (auto-ack), waiting until one is there or ctx is done.
func getOne(ctx context.Context, url, queue string) (amqp.Delivery, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return amqp.Delivery{}, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return amqp.Delivery{}, err
	}
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil || ok {
			return d, err
		}
		if !retry.Sleep(ctx, 20*time.Millisecond) {
			return amqp.Delivery{}, ctx.Err()
		}
	}
}

func TestConformanceClassic(t *testing.T) {
	brokertest.Run(t, harness(true, ""))
}

func TestConformanceQuorumRetryQueueReject(t *testing.T) {
	brokertest.Run(t, harness(false, "&queue_type=quorum&retry=queue&dead_letter=reject",
		WithQueueType(Quorum), WithRetryMode(RetryViaQueue), WithDeadLetterMode(DeadLetterReject)))
}

// Quorum queues count redeliveries in x-delivery-count: this variant's
// requeues exercise that path.
func TestConformanceQuorumRequeue(t *testing.T) {
	brokertest.Run(t, harness(true, "&queue_type=quorum", WithQueueType(Quorum)))
}

// Producers publish to an exchange and carry the id in a header as well:
// the whole contract holds with both.
func TestConformanceExchangeIDHeader(t *testing.T) {
	brokertest.Run(t, harness(true, "&exchange=idemq-test-exchange&id_header=MessageId",
		WithExchange("idemq-test-exchange"), WithIDHeader("MessageId")))
}

// deleteExchangeIfUnused deletes exchange unless a queue is still bound to
// it (another test's), ignoring errors: it only tidies the shared broker.
func deleteExchangeIfUnused(url, exchange string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_ = ch.ExchangeDelete(exchange, true, false)
	}
}
