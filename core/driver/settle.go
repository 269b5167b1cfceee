package driver

import (
	"errors"
	"fmt"
)

// The dead-letter bookkeeping headers (AMQP headers, Kafka record headers,
// SQS message attributes, NATS headers, Redis stream fields): every adapter
// parks a dead-lettered message's cause under CauseHeader, so operators
// and tools read it in one place whatever the broker, and an adapter
// written now records the rest under these names too.
const (
	// CauseHeader holds why the message was parked.
	CauseHeader = "idemq-cause"
	// AttemptHeader holds the delivery attempt it was parked at.
	AttemptHeader = "idemq-attempt"
	// OriginHeader holds where it was consumed, in the broker's terms
	// (stream/consumer/sequence, topic/partition/offset, queue).
	OriginHeader = "idemq-origin"
	// ParkedAtHeader holds when it was parked, RFC 3339 in UTC.
	ParkedAtHeader = "idemq-parked-at"
	// DestinationHeader holds where a redrive publishes it: the queue,
	// topic, subject or stream it was consumed from.
	DestinationHeader = "idemq-destination"
)

// ErrAlreadySettled is the error of a second settlement of a message the
// Consumer's flow settled before (brokertest.Receiver's deliveries return
// it): nothing is sent to the broker the second time.
var ErrAlreadySettled = errors.New("idemq: delivery already settled")

// Stale returns the error of a settlement that found its message stale: one
// received before its adapter reconnected (closed channel or connection),
// whose partition was revoked, or whose receipt handle the broker refused.
// The rule every adapter keeps: such a settlement sends nothing (the broker
// redelivers the message, and a committed one is then decided Duplicate)
// and returns an error that wraps ErrStaleDelivery and reason, so the
// Consumer counts it in Stats.Stale instead of logging it as a failure.
// The Consumer finds lapsed leases and superseded deliveries stale itself.
func Stale(reason error) error {
	if reason == nil {
		return ErrStaleDelivery
	}
	if errors.Is(reason, ErrStaleDelivery) {
		return reason
	}
	return fmt.Errorf("%w: %w", ErrStaleDelivery, reason)
}
