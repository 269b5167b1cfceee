package driver

import (
	"context"
	"net/url"
	"time"

	"github.com/idemq/idemq/internal/registry"
)

// Parked is one dead-lettered message as an operator reads it: what the
// message was, why it was parked, and where a redrive puts it back.
type Parked struct {
	// Ref identifies the parked copy within its dead-letter queue (a
	// Kafka partition/offset, an SQS message id, an AMQP position); it
	// distinguishes two parked copies of one ID.
	Ref string
	// ID is the message's business id ("" if it had none).
	ID string
	// Cause is why it was parked: the idemq-cause header, or the broker's
	// own reason (an AMQP x-death reason, an SQS redrive policy's receive
	// count) when the broker parked it.
	Cause string
	// Attempt is the delivery attempt the message had when it was parked,
	// 0 when unknown.
	Attempt int
	// Origin says where the message was consumed: a queue name, or
	// topic/partition/offset.
	Origin string
	// Destination is the queue or topic Redrive publishes the message to.
	Destination string
	// ParkedAt is when the message was parked, as the broker recorded it
	// (never later than the truth: where only the original send time is
	// known, it is that).
	ParkedAt time.Time
	// Key is the ordering key (Kafka record key, SQS MessageGroupId).
	Key string
	// Headers are the message's headers, the idemq bookkeeping ones
	// (cause, attempt, origin) included.
	Headers map[string]string
	// Body is the payload.
	Body []byte
}

// DeadLetters is an operator's handle on the dead letters of one
// consumer's queue or topic, as an adapter gives it (RegisterDeadLetters):
// read them or delete them, and put them back where they came from where
// the adapter is also a Redriver. Each call works on the messages parked when it began;
// sel, where given, is called once per message to choose the ones the call
// acts on. Implementations are not safe for concurrent use.
type DeadLetters interface {
	// Name is the dead-letter queue or topic.
	Name() string
	// Scan calls fn with each parked message, oldest first where the
	// broker keeps an order, and leaves them all parked. An error from fn
	// stops the scan and is returned.
	Scan(ctx context.Context, fn func(*Parked) error) error
	// Purge deletes the messages sel chooses and returns how many.
	Purge(ctx context.Context, sel func(*Parked) bool) (int, error)
	// Close releases the connections.
	Close() error
}

// Redriver is implemented by DeadLetters whose messages can be put back
// where they came from (a source whose sender alone can send a copy, an
// HTTP endpoint, has none).
type Redriver interface {
	// Redrive publishes each message sel chooses to its Destination with
	// its id, key, headers and body, without the idemq bookkeeping headers
	// (so its attempt count starts again), and removes it from the
	// dead-letter queue only after the broker confirmed the publish.
	// progress, if not nil, is called after each message redriven. It
	// returns the number redriven; after an error, those were redriven and
	// the rest are still parked. A message whose removal fails after its
	// publish may be redriven twice: its consumer then decides the copy
	// Duplicate.
	Redrive(ctx context.Context, sel func(*Parked) bool, progress func(done int)) (int, error)
}

// DeadLettersOpener opens the dead letters of the consumer a source URL
// of its scheme describes.
type DeadLettersOpener func(ctx context.Context, u *url.URL, cfg OpenConfig) (DeadLetters, error)

// RegisterDeadLetters makes a broker adapter's dead letters available to
// operators (admin.OpenDeadLetters, idemq dlq, the console) under a URL
// scheme. Adapters call it from init beside RegisterSource. It panics if
// the scheme is registered twice or open is nil.
func RegisterDeadLetters(scheme string, open DeadLettersOpener) {
	if open == nil {
		panic("idemq: RegisterDeadLetters " + scheme + ": nil opener")
	}
	registry.DeadLetters.Register("RegisterDeadLetters", scheme, open)
}
