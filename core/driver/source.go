// Package driver is what a broker adapter or a dedup store implements for
// idemq, apart from what a service author uses (package core), in the way
// database/sql/driver stands apart from database/sql: a Source of
// Deliveries and a Publisher for brokers, a Store of Txns for databases,
// the optional capabilities the Consumer looks for (BatchSettler,
// WindowSetter, RedeliveryHorizoner, Savepointer, Flusher, Pruner, …), and
// the registry that opens drivers by URL. Adapters prove themselves with
// the conformance suites brokers/brokertest and stores/storetest.
package driver

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"time"
)

// Message is one received message as the pipeline, observers and handlers
// see it, whatever broker it came from; core.Message is the same type.
type Message struct {
	// ID is the producer's business id: the AMQP message_id property, a
	// Kafka header, an SQS message attribute, or what an IDFunc derived.
	// Never a delivery tag, offset or receipt handle.
	ID string
	// Body is the payload as received.
	Body []byte
	// Headers holds AMQP headers, Kafka headers or SQS message attributes
	// rendered as strings. Trace context travels here.
	Headers map[string]string
	// Key is the ordering key: the Kafka message key or the SQS
	// MessageGroupId. Empty when the broker has none.
	Key string
	// Source is the queue or topic the message was received from.
	Source string
	// System names the broker in OpenTelemetry terms: "rabbitmq", "kafka",
	// "aws_sqs", or "memory".
	System string
	// Attempt is 1 on the first delivery and grows with each redelivery as
	// far as the broker lets the adapter know.
	Attempt int
	// Metadata carries broker details for observers such as tracing, keyed
	// by OpenTelemetry attribute names where one exists (for example
	// "messaging.kafka.offset", "messaging.destination.partition.id",
	// "messaging.rabbitmq.destination.routing_key").
	Metadata map[string]string
	// ReceivedAt is when the adapter received the message.
	ReceivedAt time.Time
}

// Delivery is one received message and the ways to settle it. The Consumer
// calls exactly one settlement method, once, and only after the message's
// decision is final (for Processed: after the commit).
type Delivery interface {
	// Message returns the received message. The pipeline may set its ID
	// (through an IDFunc) but does not otherwise change it.
	Message() *Message
	// Ack tells the broker the message is done (Processed or Duplicate).
	Ack(ctx context.Context) error
	// Retry asks the broker to deliver the message again, no sooner than
	// delay from now where the broker can express a delay.
	Retry(ctx context.Context, delay time.Duration) error
	// DeadLetter parks the message with its cause, never silently dropping
	// it.
	DeadLetter(ctx context.Context, cause error) error
}

// Source is a broker adapter: a stream of Deliveries. core.Source is the
// same type.
type Source interface {
	// Receive blocks until a delivery is available, ctx is done, or the
	// source is closed (ErrSourceClosed). Other errors are treated as
	// transient: the Consumer logs them and calls Receive again after a
	// backoff, so an adapter that reconnects by itself returns them only to
	// report trouble.
	Receive(ctx context.Context) (Delivery, error)
	// Close stops receiving. Deliveries not yet settled are left to the
	// broker to redeliver.
	Close() error
}

// IDErrorer is implemented by deliveries whose adapter found the id where
// it reads it but could not use it (a header of the wrong type, say). The
// message then has no ID; the Consumer dead-letters it with ErrMissingID
// and this error as the cause, so the operator reads why.
type IDErrorer interface {
	IDError() error
}

// BatchSettler is implemented by sources that can acknowledge several
// deliveries in one call (AMQP multiple ack, SQS DeleteMessageBatch). The
// Consumer uses it for the Acks of one batch; deliveries it is given came
// from this source.
type BatchSettler interface {
	AckBatch(ctx context.Context, ds []Delivery) error
}

// WindowSetter is implemented by sources that keep their own prefetch
// window (AMQP QoS, SQS receivers): the Consumer tells them its in-flight
// window before the first Receive, so the broker never hands over more than
// the Consumer will hold.
type WindowSetter interface {
	SetWindow(n int) error
}

// LoggerSetter is implemented by sources that log (reconnects, receive
// errors, settlements that failed). The Consumer gives them its own logger
// before the first Receive, so the service's logger (its level, handler and
// attributes) reaches adapter warnings too. A source that was given a logger
// of its own (an adapter option, or OpenConfig.Logger) keeps it and ignores
// SetLogger.
type LoggerSetter interface {
	SetLogger(l *slog.Logger)
}

// RedeliveryHorizoner is implemented by sources that know the longest time
// after which the broker can still redeliver a message (SQS message
// retention, Kafka topic retention, a dead-letter queue that can be
// redriven): Unbounded when the broker keeps messages until they are
// consumed. The Consumer warns at start-up when the store's retention is
// shorter (or refuses to start, with core.WithStrictRetention), because a
// redelivery after the dedup row was pruned would apply the effect twice.
// The bool is false when the horizon is not known.
type RedeliveryHorizoner interface {
	RedeliveryHorizon(ctx context.Context) (time.Duration, bool)
}

// Unbounded is the redelivery horizon of a broker that keeps a message
// until it is consumed (a RabbitMQ queue without a TTL, a Kafka topic with
// retention.ms=-1).
const Unbounded = time.Duration(math.MaxInt64)

// Sentinel errors of the driver contract. core re-exports them.
var (
	// ErrSourceClosed is returned by Source.Receive after Close.
	ErrSourceClosed = errors.New("idemq: source closed")
	// ErrStaleDelivery is wrapped by adapters' settlement errors that mean
	// "this delivery can no longer be settled, and the broker will
	// redeliver it": its channel died, its lease or visibility expired,
	// its partition was revoked. The Consumer counts these apart from
	// other settlement failures; the redelivery is decided Duplicate if
	// the message was committed.
	ErrStaleDelivery = errors.New("idemq: stale delivery; the broker will redeliver it")
)

// Publisher sends messages, setting each message's business id where its
// broker carries it (AMQP message_id, the Kafka or SQS message-id header)
// and the caller's trace context in the headers. It is the one publishing
// shape: a service's producers, the outbox relay and the tests all use
// it. core.Publisher is the same type.
type Publisher interface {
	// Publish sends msgs to destination (a queue, topic or routing key in
	// the broker's terms) or, when destination is "", to the destination
	// the Publisher was opened for. It returns only after the broker
	// confirmed every message.
	Publish(ctx context.Context, destination string, msgs ...*Message) error
	// Close releases the Publisher's connections.
	Close() error
}
