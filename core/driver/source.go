// Package driver is the contract between idemq and a broker adapter or a
// dedup store, apart from what a service author uses (package core) and
// what an operator uses (package admin), in the way database/sql/driver
// stands apart from database/sql: a Source of Deliveries and a Publisher
// for brokers, a Store of Txns for databases, the optional capabilities
// the Consumer looks for (BatchSettler, WindowSetter, RedeliveryHorizoner,
// DeliveryLimiter, Savepointer, Flusher, Leaser, …), and the registration of openers by URL
// scheme. Adapters import this package, never core; they prove themselves
// with the conformance suites brokers/brokertest and stores/storetest.
package driver

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"maps"
	"math"
	"time"
)

// Message is one message as an adapter receives or publishes it. The
// Consumer hands it to handlers as a core.Message, which has the same
// fields: keep the two in step.
type Message struct {
	// ID is the producer's business id, where the broker carries it: the
	// AMQP message_id property (or a header), a Kafka record header, an
	// SQS message attribute, NATS's Nats-Msg-Id header (or another
	// header). Never a delivery tag, offset, sequence or receipt handle.
	// Empty when the message has none: the Consumer dead-letters it.
	ID string
	// Body is the payload as received.
	Body []byte
	// Headers holds AMQP headers, Kafka record headers, SQS message
	// attributes or NATS headers rendered as strings. Trace context travels
	// here.
	Headers map[string]string
	// Key is the ordering key: the Kafka message key or the SQS
	// MessageGroupId. Empty when the broker has none.
	Key string
	// Source is the queue, topic or NATS subject the message was received
	// from.
	Source string
	// System names the broker in OpenTelemetry terms: "rabbitmq", "kafka",
	// "aws_sqs", "nats", or "memory".
	System string
	// Attempt is 1 on the first delivery and grows with each redelivery as
	// far as the broker lets the adapter know.
	Attempt int
	// Metadata carries broker details for observers such as tracing (see
	// Metadata); nil when the adapter has none.
	Metadata Metadata
	// ReceivedAt is when the adapter received the message.
	ReceivedAt time.Time
}

// Metadata is a received message's broker details for observers such as
// tracing, keyed by OpenTelemetry attribute names where one exists (for
// example "messaging.kafka.offset", "messaging.destination.partition.id",
// "messaging.rabbitmq.destination.routing_key"). An adapter implements it
// over what its delivery already holds, so the details cost nothing until
// an observer reads them; MetadataMap holds them in a map.
type Metadata interface {
	// All yields each key and its value, in no set order.
	All() iter.Seq2[string, string]
}

// MetadataMap is Metadata held in a map.
type MetadataMap map[string]string

// All yields the map's keys and values.
func (m MetadataMap) All() iter.Seq2[string, string] { return maps.All(m) }

// MetadataOf returns md's details in a map, empty when md is nil: for
// reading a few keys where cost does not matter (tests, tools).
func MetadataOf(md Metadata) map[string]string {
	if md == nil {
		return map[string]string{}
	}
	return maps.Collect(md.All())
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

// Source is a broker adapter: a stream of Deliveries, which the Consumer
// takes.
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
// retention, Kafka topic retention, a stream's MaxAge, a dead-letter queue
// that can be redriven): Unbounded when the broker sets no age limit on
// the messages it keeps. The Consumer warns at start-up when the store's retention is
// shorter (or refuses to start, with core.WithStrictRetention), because a
// redelivery after the dedup row was pruned would apply the effect twice.
// The bool is false when the horizon is not known.
type RedeliveryHorizoner interface {
	RedeliveryHorizon(ctx context.Context) (time.Duration, bool)
}

// HorizonHinter is implemented by sources that can say how an operator
// bounds their redelivery horizon to fit a store's retention, in the
// broker's own terms (a queue policy, a stream's MaxAge, a topic's
// retention.ms). The Consumer puts the hint in its retention warning.
type HorizonHinter interface {
	HorizonHint(retention time.Duration) string
}

// DeliveryLimiter is implemented by sources whose broker stops
// redelivering a message, archiving or dropping it rather than parking
// it, once it was delivered a number of times without being acknowledged
// (a Kafka share group's group.share.delivery.count.limit). DeliveryLimit
// returns that number, the count of deliveries the broker makes at most;
// the bool is false when it is not known. The Consumer warns at start-up
// when its MaxAttempts is higher (or refuses to start, with
// core.WithStrictDeliveryLimit), because the broker would then drop a
// failing message before the Consumer dead-letters it. A broker that
// parks the message in a dead-letter queue of its own at its limit (an
// SQS maxReceiveCount) loses nothing and needs no DeliveryLimiter.
type DeliveryLimiter interface {
	DeliveryLimit(ctx context.Context) (int, bool)
}

// DeliveryLimitHinter is implemented by sources that can say how an
// operator raises their broker's delivery limit to at least maxAttempts,
// in the broker's own terms (the group config to set, and how). The
// Consumer puts the hint in its delivery-limit warning.
type DeliveryLimitHinter interface {
	DeliveryLimitHint(maxAttempts int) string
}

// Unbounded is the redelivery horizon of a broker that keeps a message
// until it is consumed (a RabbitMQ queue without a TTL, a Kafka topic with
// retention.ms=-1).
const Unbounded = time.Duration(math.MaxInt64)

// Sentinel errors of the driver contract. core re-exports them for
// services.
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
	// ErrInvalidID is wrapped by errors about an id the store or the
	// Consumer cannot take: longer than allowed, a NUL byte, invalid
	// UTF-8.
	ErrInvalidID = errors.New("message id is invalid")
)

// Publisher sends messages, setting each message's business id where its
// broker carries it (AMQP message_id, the Kafka or SQS message-id header,
// Nats-Msg-Id) and the caller's trace context in the headers. The outbox
// relay publishes through it; services publish through core.Publisher,
// which wraps it.
type Publisher interface {
	// Publish sends msgs to destination (a queue, topic or routing key in
	// the broker's terms) or, when destination is "", to the destination
	// the Publisher was opened for. It returns only after the broker
	// confirmed every message.
	Publish(ctx context.Context, destination string, msgs ...*Message) error
	// Close releases the Publisher's connections.
	Close() error
}

type permanentError struct{ err error }

func (p permanentError) Error() string { return "permanent: " + p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }

// Permanent marks err as permanent: no retry can change it (a handler's
// bad input, a broker's refusal of a message it will never take). The
// Consumer dead-letters the message at once, and the outbox relay parks
// the row. Permanent(nil) is nil. core.Permanent is the same function.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}
