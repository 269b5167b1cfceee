package driver

import (
	"errors"
	"fmt"
	"sync/atomic"
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

// ErrAlreadySettled is returned by a Delivery's Ack, Retry or DeadLetter,
// and by BatchSettler.AckBatch, for a delivery that was settled before:
// nothing is sent to the broker the second time.
var ErrAlreadySettled = errors.New("idemq: delivery already settled")

// SettleOnce is the settle-once guard every adapter's deliveries embed: the
// first Claim wins the right to settle, every later one gets
// ErrAlreadySettled. The zero value is an unsettled delivery; it is safe for
// concurrent use.
type SettleOnce struct{ done atomic.Bool }

// Claim marks the delivery settled and returns nil the first time, and
// ErrAlreadySettled on every later call. An adapter calls it before it
// sends anything to the broker.
func (s *SettleOnce) Claim() error {
	if s.done.CompareAndSwap(false, true) {
		return nil
	}
	return ErrAlreadySettled
}

// Settled reports whether Claim has been called.
func (s *SettleOnce) Settled() bool { return s.done.Load() }

// Stale returns the error of a settlement that found its delivery stale: a
// delivery received before its adapter reconnected (closed channel or
// connection), whose lease or visibility expired, whose partition was
// revoked, or whose source closed. The rule every adapter keeps: such a
// settlement sends nothing (the broker redelivers the message, and a
// committed one is then decided Duplicate) and returns an error that wraps
// ErrStaleDelivery and reason, so the Consumer counts it in Stats.Stale
// instead of logging it as a failure.
func Stale(reason error) error {
	if reason == nil {
		return ErrStaleDelivery
	}
	if errors.Is(reason, ErrStaleDelivery) {
		return reason
	}
	return fmt.Errorf("%w: %w", ErrStaleDelivery, reason)
}
