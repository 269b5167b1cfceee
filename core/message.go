package core

import (
	"context"
	"time"
)

// Message is one received message as the pipeline, middleware and handlers
// see it, whatever broker it came from.
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
	// Metadata carries broker details for middleware such as tracing, keyed
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

// Source is a broker adapter: a stream of Deliveries.
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

// RedeliveryHorizoner is implemented by sources that know the longest time
// after which the broker can still redeliver a message (SQS message
// retention, Kafka topic retention, a dead-letter queue that can be
// redriven). The Consumer warns at start-up when the store's retention is
// shorter, because a redelivery after the dedup row was pruned would apply
// the effect twice.
type RedeliveryHorizoner interface {
	RedeliveryHorizon(ctx context.Context) (time.Duration, bool)
}
