// Package driver is the contract between idemq and a broker adapter or a
// dedup store, apart from what a service author uses (package core) and
// what an operator uses (package admin), in the way database/sql/driver
// stands apart from database/sql: a Source (a Puller the Consumer asks for
// messages, or a Pusher that hands them over) and a Publisher for brokers,
// DeadLetters for operators, a Store of Txns for databases, the optional
// capabilities the Consumer looks for (Extender, Releaser, Abandoner,
// RedeliveryHorizoner, DeliveryLimiter, Savepointer, Flusher, Leaser, …),
// and the registration of openers by URL scheme. The Consumer owns
// delivery (window, settling once and in sets, leases, staleness, retry
// delays, releasing at stop), so an adapter is only its protocol. Adapters
// import this package, never core; they prove themselves with the
// conformance suites brokers/brokertest and stores/storetest.
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
// Consumer hands handlers a core.Message, whose documentation holds for
// the fields the two share (ID to ReceivedAt); the fields after those are
// the adapter's own.
type Message struct {
	// ID is the producer's business id where the broker carries it, never
	// a handle of one delivery (a tag, offset or receipt handle); empty
	// when the message has none, which the Consumer dead-letters.
	ID         string
	Body       []byte
	Headers    map[string]string // rendered as strings; trace context travels here
	Key        string            // the ordering key; "" where the broker has none
	Source     string            // the queue, topic or subject it came from
	System     string            // the broker in OpenTelemetry terms: "rabbitmq", "kafka", "aws_sqs", "nats", "memory"
	Attempt    int               // 1 on the first delivery, then growing as far as the adapter can tell
	Metadata   Metadata          // broker details for observers; nil for none
	ReceivedAt time.Time         // when the adapter received it

	// AckID is the adapter's own handle on this delivery of the message
	// (a delivery tag, a receipt handle, a JetStream message): the
	// Consumer hands the message back to the adapter's settlement calls
	// with it untouched. A Publisher ignores it.
	AckID any
	// BrokerKey names the message in the broker across its deliveries (a
	// stream sequence, an entry id, an SQS MessageId), for a broker that
	// may hand a message out again to the same consumer while that one
	// still holds it: a newer delivery with an equal BrokerKey supersedes
	// the older, whose settlement is then stale. Nil: never superseded.
	// It must be comparable.
	BrokerKey any
	// IDError says why the adapter found no usable id where it reads it (a
	// header of the wrong type, say), when ID is empty: the Consumer
	// dead-letters the message with ErrMissingID and this as the cause, so
	// the operator reads why.
	IDError error
	// Unreadable says why the adapter could not read the message whole (a
	// field its URL names for the body is missing): the Consumer
	// dead-letters it at once with this cause, never handing it to a
	// handler with a part missing.
	Unreadable error
}

// Metadata is a received message's broker details for observers such as
// tracing, keyed by OpenTelemetry attribute names where one exists (for
// example "messaging.kafka.offset", "messaging.destination.partition.id",
// "messaging.rabbitmq.destination.routing_key"), each value typed as the
// attribute is (an offset is an integer, a flag a boolean). An adapter
// implements it over what its delivery already holds, so the details cost
// nothing until an observer reads them; MetadataMap holds them in a map.
type Metadata interface {
	// All yields each key and its value, in no set order.
	All() iter.Seq2[string, slog.Value]
}

// MetadataMap is Metadata held in a map.
type MetadataMap map[string]slog.Value

// All yields the map's keys and values.
func (m MetadataMap) All() iter.Seq2[string, slog.Value] { return maps.All(m) }

// MetadataOf returns md's details in a map, each value as its text, empty
// when md is nil: for reading a few keys where cost does not matter
// (tests, tools).
func MetadataOf(md Metadata) map[string]string {
	out := map[string]string{}
	if md == nil {
		return out
	}
	for k, v := range md.All() {
		out[k] = v.String()
	}
	return out
}

// Source is a broker adapter as the Consumer drives it: the adapter is its
// protocol only. The Consumer owns everything around it: the window and
// how many messages to ask for, settling each message once, gathering a
// batch's settlements into one call per kind, extending leases up to a
// maximum, telling a stale message from a live one, giving back what it
// holds when it stops, and logging. A Source is also a Puller (the
// Consumer asks it for messages) or a Pusher (it hands messages to the
// Consumer as its senders send them); core.New takes either.
//
// Settlement calls get the messages this Source returned, each carrying
// the adapter's own AckID, and are made once per message, only after its
// decision is final (for Processed: after the commit). A call with several
// messages should be one request where the broker allows it. When some of
// its messages fail and others do not, the call returns a *Partial.
type Source interface {
	// Start prepares the source for a Consumer that holds at most
	// s.Window messages unsettled (an AMQP QoS, a JetStream
	// MaxAckPending) and logs to s.Logger, and reports the broker's
	// Traits. The Consumer calls it once, before anything else. A source
	// given a logger of its own (an adapter option, OpenConfig.Logger)
	// keeps it.
	Start(ctx context.Context, s Setup) (Traits, error)
	// Ack tells the broker the messages are done (Processed or Duplicate).
	Ack(ctx context.Context, ms []*Message) error
	// Retry hands the messages back for redelivery, no sooner than delay
	// from now where Traits.DelaysRetry says the broker can wait;
	// otherwise the Consumer waits out the delay itself and calls Retry
	// with 0.
	Retry(ctx context.Context, ms []*Message, delay time.Duration) error
	// DeadLetter parks each message with its cause (causes[i] is ms[i]'s),
	// never dropping one: a message whose park failed is handed back for
	// redelivery and reported failed.
	DeadLetter(ctx context.Context, ms []*Message, causes []error) error
	// Close releases the source's connections. Messages it received that
	// the Consumer never got (a prefetch buffer) go back to the broker;
	// the Consumer releases those it held (Releaser) before it calls
	// Close.
	Close() error
}

// Puller is a Source the Consumer asks for messages: a queue, a stream, a
// topic.
type Puller interface {
	Source
	// Receive blocks until at least one message is available, ctx is done
	// or the source is closed (ErrSourceClosed), and returns at most max
	// messages (never more than Traits.MaxBatch). Other errors are
	// transient: the Consumer logs them and calls Receive again after a
	// backoff, so an adapter that reconnects by itself returns them only
	// to report trouble. The Consumer keeps up to Traits.Receivers calls
	// outstanding at once.
	Receive(ctx context.Context, max int) ([]*Message, error)
}

// Pusher is a Source whose senders wait for the answer (HTTP): it calls the
// Consumer, as net/http calls a Handler.
type Pusher interface {
	Source
	// Serve hands each message its senders send to deliver, until ctx is
	// done (then it stops taking new ones and returns once no deliver call
	// is under way) or it fails. deliver waits for room in the Consumer's
	// window, under ctx (the request's): it returns ctx's error or
	// ErrSourceClosed when the message was never taken. Once taken, it
	// returns when the message is settled (the source's Ack, Retry,
	// DeadLetter or Release was called for it, so the answer is known),
	// whatever ctx does meanwhile.
	Serve(ctx context.Context, deliver Deliver) error
}

// Deliver is how a Pusher hands one message to the Consumer: see
// Pusher.Serve.
type Deliver func(ctx context.Context, m *Message) error

// Setup is what the Consumer tells a source when it starts it.
type Setup struct {
	// Window is the most messages the Consumer holds unsettled at once.
	Window int
	// Logger is the Consumer's logger.
	Logger *slog.Logger
	// KeyOrder is true when the Consumer decides messages of one Key in
	// the order Receive returned them and, once it has retried one,
	// releases each message of that Key it receives until the retried
	// one (by ID) comes back. Only a Releaser is asked. A source that
	// keeps each key's messages in order may then hand out a key's next
	// messages while earlier ones are unsettled, provided Retry puts a
	// message back ahead of its key's later ones and hands out nothing
	// of its key until those that were out are back, and Release puts a
	// message back in its place; it says so in Traits.KeyOrder.
	KeyOrder bool
}

// Traits is what a source tells the Consumer about its broker when it
// starts.
type Traits struct {
	// MaxBatch is the most messages one Receive returns (an SQS receive
	// takes at most 10); the Consumer never asks for more. 0: no limit of
	// the source's own.
	MaxBatch int
	// Receivers is how many Receive calls the Consumer keeps outstanding
	// at once: more than one for a broker whose receive is a request of
	// bounded size (an SQS long poll). 0 means 1.
	Receivers int
	// Lease is how long the broker waits for a received message's
	// settlement before it hands the message out again, unless an Extend
	// renews it (an SQS visibility timeout, a JetStream AckWait, a share
	// group's record lock): the Consumer reckons from it when a message
	// went stale, and extends held messages (Extender) before it passes.
	// 0: the broker holds a message until the connection that received
	// it closes (AMQP) or its partition moves (Kafka). A lease is reckoned
	// from the message's ReceivedAt: set it when the message arrived from
	// the broker, not when Receive returned it from a buffer.
	Lease time.Duration
	// MaxExtension bounds how long after its receipt a message's lease is
	// extended; past it the lease lapses and the broker redelivers. 0:
	// for as long as the Consumer holds it; below 0: never (a source whose
	// heartbeat the user turned off).
	MaxExtension time.Duration
	// DelaysRetry is true when the broker waits out Retry's delay itself
	// (an SQS visibility, a JetStream NakWithDelay, an HTTP Retry-After).
	DelaysRetry bool
	// KeyOrder is true when the source took up Setup.KeyOrder: it hands
	// out a key's messages before the earlier ones are settled, waits out
	// Retry's delay itself (DelaysRetry), keeps one receiver, and gives a
	// message the same comparable AckID each time it hands it out. The
	// Consumer then holds back a key's messages behind a retried one.
	KeyOrder bool
	// ReceiveLinger is how long the Consumer waits for room for a whole
	// MaxBatch before a receive when it has room for fewer: for a broker
	// whose every receive is a billed request (SQS). 0: it receives as soon
	// as there is room for one.
	ReceiveLinger time.Duration
}

// Extender is implemented by sources whose broker leases what it
// delivered (Traits.Lease): Extend renews each message's lease by
// Traits.Lease from now (ChangeMessageVisibility, InProgress, a record
// lock's RENEW). The Consumer calls it for the messages it holds before
// their leases pass, up to Traits.MaxExtension; a lease counts as renewed
// only once Extend returned without an error for it. Extend may race with
// a settlement of the same message, which must not fail because of it.
type Extender interface {
	Extend(ctx context.Context, ms []*Message) error
}

// Releaser is implemented by sources that can hand messages back to the
// broker at once, undecided, for redelivery without waiting (a nack, a
// visibility of zero, a record's RELEASE): the Consumer releases what it
// still holds when it stops (messages it received but never decided, and
// retries waiting out their delay), so they are redelivered at once.
// Without it the Consumer leaves them to the broker, which redelivers
// them when the source's Close drops the connection they were received
// on (AMQP), a partition moves (Kafka) or their lease lapses.
type Releaser interface {
	Release(ctx context.Context, ms []*Message) error
}

// Abandoner is implemented by sources whose broker wants an answer for
// every message it delivered, even one the Consumer no longer settles (a
// Kafka share group acknowledges each record of a poll): Abandon is told,
// once, of each message that went stale while the Consumer held it (its
// lease lapsed, a newer delivery superseded it, or it was stale when its
// decision came), so the source can release it. Other sources need not implement it: the Consumer sends
// nothing for a stale message and the broker redelivers it by itself.
type Abandoner interface {
	Abandon(ctx context.Context, ms []*Message)
}

// Partial is the error of a settlement, Extend or Publish call of which
// some messages failed and the others did not: Errs[i] is the error of
// the call's ms[i], nil where that one succeeded. Any other error from
// such a call counts for every message of the call.
type Partial struct {
	Errs []error
}

// Error joins the messages' errors.
func (p *Partial) Error() string {
	return errors.Join(p.Errs...).Error()
}

// Unwrap returns the messages' errors, so errors.Is finds
// ErrStaleDelivery among them.
func (p *Partial) Unwrap() []error { return p.Errs }

// PartialOf returns nil when every error of errs is nil, else a *Partial
// holding them: what a settlement call returns after settling its messages
// one by one.
func PartialOf(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return &Partial{Errs: errs}
		}
	}
	return nil
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
	// confirmed every message. When the broker took some messages and
	// refused others, and can say which, it returns a *Partial, so that
	// a caller sends again only the refused ones.
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
