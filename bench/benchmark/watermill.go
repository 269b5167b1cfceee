package benchmark

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The Watermill configuration is the seed pattern written the way a
// Watermill user writes it: a message.Router whose handlers each consume the
// run's queue through a watermill-amqp subscriber, and run the store's seed
// transaction (claim, UPDATE, COMMIT) for every message; the router acks
// when the handler returns nil and nacks (requeue) when it returns an error.
//
// watermill-amqp hands a subscription's messages over one at a time: it
// waits for a message's ack or nack before it passes on the next, whatever
// the prefetch. Concurrency therefore comes from handlers: each one is its
// own subscription, on its own channel of the subscriber's connection, with
// QoS prefetch watermillPrefetch.

// watermillPrefetch and watermillHandlers are the Watermill configuration's
// QoS prefetch per channel and number of router handlers on the queue. The
// values are the best of the sweep in results/watermill-sweep.txt.
var (
	watermillPrefetch = 100
	watermillHandlers = 8
)

// watermillBroker is a broker side that can run the Watermill
// configuration (RabbitMQ only).
type watermillBroker interface {
	watermill(ctx context.Context, e *runEnv, t *tracker, prefetch, handlers int) (*counts, error)
}

// existingQueue is a watermill-amqp TopologyBuilder that declares nothing:
// the benchmark has declared the run's queue with the arguments of idemq's
// topology (dead-letter exchange and routing key), which watermill-amqp's
// default declaration, without them, would contradict
// (PRECONDITION_FAILED). It only checks passively that the queue exists.
type existingQueue struct{}

// BuildTopology checks that the queue exists, declaring it passively.
func (existingQueue) BuildTopology(ch *amqp.Channel, p wamqp.BuildTopologyParams, _ wamqp.Config, _ watermill.LoggerAdapter) error {
	if _, err := ch.QueueDeclarePassive(p.QueueName, true, false, false, false, nil); err != nil {
		return fmt.Errorf("queue %s: %w", p.QueueName, err)
	}
	return nil
}

// ExchangeDeclare declares nothing: the run's queue is on the default
// exchange.
func (existingQueue) ExchangeDeclare(*amqp.Channel, string, wamqp.Config) error { return nil }

// deliveryMarshaler turns the benchmark's deliveries into Watermill
// messages: the AMQP message-id as the message's UUID, the body as its
// payload and the publish time header as metadata. (watermill-amqp's
// DefaultMarshaler reads the UUID from a header of its own and refuses
// headers that are not strings, such as the publish time.)
type deliveryMarshaler struct{}

// Marshal fails: the benchmark publishes with amqp091-go.
func (deliveryMarshaler) Marshal(*message.Message) (amqp.Publishing, error) {
	return amqp.Publishing{}, errors.New("the benchmark does not publish through Watermill")
}

// Unmarshal makes a Watermill message of a delivery.
func (deliveryMarshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	m := message.NewMessage(d.MessageId, d.Body)
	if ts := headerNanos(d.Headers); ts > 0 {
		m.Metadata.Set(headerTS, strconv.FormatInt(ts, 10))
	}
	return m, nil
}

// watermill runs the Watermill configuration on e's queue until ctx ends:
// handlers router handlers on one watermill-amqp subscriber, each channel
// with QoS prefetch, each message through the store's seedTx.
func (r *rabbit) watermill(ctx context.Context, e *runEnv, t *tracker, prefetch, handlers int) (*counts, error) {
	cfg := wamqp.NewDurableQueueConfig(r.rawURL)
	cfg.Queue.GenerateName = func(string) string { return e.queue }
	cfg.TopologyBuilder = existingQueue{}
	cfg.Marshaler = deliveryMarshaler{}
	cfg.Consume.Qos.PrefetchCount = prefetch
	logger := watermill.NewSlogLogger(e.logger)
	sub, err := wamqp.NewSubscriber(cfg, logger)
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return nil, err
	}
	var c counts
	handle := func(m *message.Message) error {
		dup, err := e.store.seedTx(m.Context(), e, &msg{id: m.UUID, body: m.Payload})
		if err != nil {
			if ctx.Err() == nil { // not shutting down
				c.retried.Add(1)
			}
			return err // nacked and requeued
		}
		if dup {
			c.duplicates.Add(1)
		} else {
			c.processed.Add(1)
		}
		ts, _ := strconv.ParseInt(m.Metadata.Get(headerTS), 10, 64)
		t.decided(m.UUID, ts) // at the commit, before the ack
		t.batches.Add(1)
		return nil
	}
	for i := range handlers {
		router.AddNoPublisherHandler(fmt.Sprintf("seed-%d", i), e.queue, sub, handle)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case err := <-runErr:
		// The router stopped by itself: a subscription failed to start,
		// or every subscription ended (the connection was lost).
		if err == nil && ctx.Err() == nil {
			err = errors.New("watermill router stopped")
		}
		return &c, err
	case <-ctx.Done():
	}
	if err := router.Close(); err != nil {
		return &c, err
	}
	<-runErr
	return &c, nil
}
