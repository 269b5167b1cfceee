package core

import (
	"time"

	"github.com/idemq/idemq/core/driver"
)

// Message is one received message as handlers, middleware and observers
// see it, whatever broker it came from. Handlers read it and must not
// keep it past their call.
type Message struct {
	// ID is the producer's business id: the AMQP message_id property, a
	// Kafka record header, an SQS message attribute or NATS's Nats-Msg-Id
	// header (each adapter's id_header= URL parameter names another
	// header), or what WithIDFunc derived. The dedup key is (consumer
	// name, ID). Never a delivery tag, offset, sequence or receipt handle:
	// those change on redelivery.
	ID string
	// Body is the payload as received.
	Body []byte
	// Headers holds AMQP headers, Kafka record headers, SQS message
	// attributes or NATS headers rendered as strings. Trace context
	// travels here.
	Headers map[string]string
	// Key is the ordering key: the Kafka record key or the SQS
	// MessageGroupId. Empty when the broker has none.
	Key string
	// Source is the queue, topic or NATS subject the message was received
	// from.
	Source string
	// System names the broker in OpenTelemetry terms: "rabbitmq", "kafka",
	// "aws_sqs", "nats" or "memory".
	System string
	// Attempt is 1 on the first delivery and grows with each redelivery as
	// far as the broker lets the adapter know (RabbitMQ's redelivered flag
	// and x-delivery-count, SQS's ApproximateReceiveCount, NATS's
	// delivery count, an in-process count on Kafka).
	Attempt int
	// Metadata carries broker details for observers such as tracing, keyed
	// by OpenTelemetry attribute names where one exists (for example
	// "messaging.kafka.offset", "messaging.destination.partition.id",
	// "messaging.rabbitmq.destination.routing_key"), typed, read on
	// demand (All yields them); nil when the adapter has none.
	Metadata driver.Metadata
	// ReceivedAt is when the adapter received the message.
	ReceivedAt time.Time
}
