package core

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// Decision is what the pipeline decided for one message. There are exactly
// four.
type Decision int

const (
	// Processed: the claim won, the handler succeeded, the transaction
	// committed; the message is acknowledged.
	Processed Decision = iota + 1
	// Duplicate: the claim lost because the id was already committed; the
	// handler did not run; the message is acknowledged.
	Duplicate
	// Retry: a transient error (handler, claim or commit); everything was
	// rolled back and the message is redelivered after a backoff delay.
	Retry
	// DeadLetter: a permanent error, too many attempts, a missing or
	// invalid id, or a reused id with a different body; the message is
	// parked with its cause and never silently dropped.
	DeadLetter
)

// String returns the decision's name as used in logs, span attributes and
// metrics: processed, duplicate, retry, dead_letter.
func (d Decision) String() string {
	switch d {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case Retry:
		return "retry"
	case DeadLetter:
		return "dead_letter"
	}
	return "undecided"
}

// Outcome is a Decision with its cause and, for Retry, the delay before the
// redelivery.
type Outcome struct {
	Decision Decision
	// Err is the cause of a Retry or DeadLetter, nil otherwise.
	Err error
	// Delay is how long the broker should wait before redelivering a Retry.
	Delay time.Duration
}

// Sentinel errors for the causes the pipeline itself records, always
// inside a DecisionError, whose text carries the "idemq:" prefix. Test
// with errors.Is.
var (
	// ErrMissingID: the message has no business id.
	ErrMissingID = errors.New("message has no id")
	// ErrInvalidID: the id is longer than the configured maximum, or holds
	// a NUL byte or invalid UTF-8.
	ErrInvalidID = driver.ErrInvalidID
	// ErrTooLarge: the message's body or header count is over its
	// Limits.
	ErrTooLarge = errors.New("message over its limits")
	// ErrFingerprintMismatch: the id was already processed with a
	// different body.
	ErrFingerprintMismatch = errors.New("message id reused with a different body")
	// ErrMaxAttempts: a transient error persisted through MaxAttempts
	// deliveries.
	ErrMaxAttempts = errors.New("too many attempts")
	// ErrSourceClosed is returned by Source.Receive after Close, and
	// wrapped by Run's error when the source closed by itself.
	ErrSourceClosed = driver.ErrSourceClosed
	// ErrStaleDelivery is wrapped by settlement errors that mean the
	// delivery can no longer be settled and the broker will redeliver it;
	// Stats counts them as Stale.
	ErrStaleDelivery = driver.ErrStaleDelivery
	// ErrShutdown: the message was still being processed when the
	// shutdown deadline passed; it was rolled back and left for
	// redelivery.
	ErrShutdown = errors.New("shutting down")
)

// Permanent marks err as permanent: the message is dead-lettered at once
// instead of retried. Permanent(nil) is nil. It is driver.Permanent, so a
// broker's or store's permanent errors are recognised too.
func Permanent(err error) error { return driver.Permanent(err) }

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool { return driver.IsPermanent(err) }

// DecisionError is the error a Retry or DeadLetter settles with: it names
// the message and the stage that failed.
type DecisionError struct {
	MessageID string
	// Stage is where the decision was made (see StageName): StageID,
	// StageLimits, StageBegin, StageClaim, StageFingerprint, StageHandler,
	// StageSavepoint, StageFlush, StageCommit or StageBatch; under
	// NewLeased also StageLease, StageExternal and StageFence. A message
	// left for redelivery at shutdown keeps the stage it was at, with
	// ErrShutdown in Err.
	Stage StageName
	Err   error
}

// Error names the message (or says it had no id), the stage and the cause.
func (e *DecisionError) Error() string {
	if e.MessageID == "" {
		return fmt.Sprintf("idemq: message without an id: %s: %v", e.Stage, e.Err)
	}
	return fmt.Sprintf("idemq: message %q: %s: %v", shortID(e.MessageID), e.Stage, e.Err)
}

// Unwrap returns the underlying cause.
func (e *DecisionError) Unwrap() error { return e.Err }
