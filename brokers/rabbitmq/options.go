package rabbitmq

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/option"
)

// QueueType is the kind of queue the Source declares.
type QueueType string

const (
	// Classic is a classic durable queue. Redeliveries are only flagged
	// (redelivered), so Attempt is 1 or 2.
	Classic QueueType = "classic"
	// Quorum is a replicated quorum queue. It counts deliveries in the
	// x-delivery-count header, so Attempt grows with each redelivery.
	Quorum QueueType = "quorum"
)

// RetryMode chooses how Delivery.Retry asks for a redelivery.
type RetryMode int

const (
	// RetryRequeue keeps the message unacked for the delay (it keeps its
	// place in the prefetch window, which throttles a failing consumer),
	// then nacks it with requeue. Nothing is published.
	RetryRequeue RetryMode = iota + 1
	// RetryViaQueue publishes a copy to the retry queue with a per-message
	// TTL equal to the delay, confirmed, then acks the original; the retry
	// queue dead-letters the copy back to the main queue when the TTL
	// expires. The attempt travels in driver.AttemptHeader. RabbitMQ
	// expires messages only at the head of a queue, so a short delay can
	// wait behind a longer one.
	RetryViaQueue
)

// DeadLetterMode chooses how Delivery.DeadLetter parks a message.
type DeadLetterMode int

const (
	// DeadLetterRepublish publishes a copy to the dead-letter queue with
	// the cause in the idemq-cause header (driver.CauseHeader; mandatory,
	// confirmed), then acks the original. If the copy cannot be routed,
	// DeadLetter fails and the message stays unacked: it is never dropped.
	DeadLetterRepublish DeadLetterMode = iota + 1
	// DeadLetterReject rejects the message without requeue so the broker
	// moves it through the queue's dead-letter exchange; the broker records
	// only the reason "rejected" in x-death, and the cause is logged. The
	// queue must have a dead-letter exchange, or the broker drops the
	// message.
	DeadLetterReject
)

// Option configures a Source. Options are applied in order; an invalid
// value makes Open fail with an error naming the option.
type Option func(*config) error

// connConfig is what a Source and a Publisher both configure.
type connConfig struct {
	connName string
	dial     amqp.Config
	dialSet  bool
	idHeader string // "" reads and writes the id in message_id only
}

type config struct {
	connConfig
	queue           string
	prefetch        int
	declare         bool
	queueType       QueueType
	deadLetterQueue string
	retryQueue      string
	retryMode       RetryMode
	deadLetterMode  DeadLetterMode
	consumerTag     string
	exchange        string
	backoffMin      time.Duration
	backoffMax      time.Duration
	logger          *slog.Logger // nil: SetLogger's, else slog.Default()
	deliveryLimit   int
	messageTTL      time.Duration
	policyTTL       time.Duration
}

// defaultConfig is the configuration before options; the dead-letter and
// retry queues' names follow the queue's once the options are applied.
func defaultConfig(queue string) config {
	return config{
		connConfig:     connConfig{connName: "idemq"},
		queue:          queue,
		prefetch:       100,
		declare:        true,
		queueType:      Classic,
		retryMode:      RetryRequeue,
		deadLetterMode: DeadLetterRepublish,
		backoffMin:     100 * time.Millisecond,
		backoffMax:     2 * time.Second,
	}
}

// invalid is the error of option opt given a bad value (nil when bad is
// false); the message says why.
func invalid(bad bool, opt, format string, args ...any) error {
	if !bad {
		return nil
	}
	return fmt.Errorf("rabbitmq: %s: %s", opt, fmt.Sprintf(format, args...))
}

// nameErr checks a queue or exchange name given to option opt.
func nameErr(opt, name string) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("rabbitmq: %s: %w", opt, err)
	}
	return nil
}

// WithQueue names the queue to consume, instead of the URL's queue
// parameter. One of them is required.
func WithQueue(name string) Option {
	return option.Check(nameErr("WithQueue", name), func(c *config) { c.queue = name })
}

// WithPrefetch sets the QoS prefetch count used until the Consumer calls
// SetWindow (which replaces it). Default 100. Must be 1..65535.
func WithPrefetch(n int) Option {
	return option.Check(invalid(n < 1 || n > 65535, "WithPrefetch", "%d is outside 1..65535", n),
		func(c *config) { c.prefetch = n })
}

// WithDeclare chooses whether Open declares the topology: the queue
// (durable, with the dead-letter queue as its dead-letter target through the
// default exchange), the dead-letter queue, with RetryViaQueue the retry
// queue and, with WithExchange, the exchange and the queue's binding to it.
// Default true. Pass false when operators own the topology; the queues must
// then exist.
func WithDeclare(declare bool) Option {
	return option.Check(nil, func(c *config) { c.declare = declare })
}

// WithQueueType sets the type of the queues Open declares. Default Classic.
func WithQueueType(t QueueType) Option {
	return option.Check(invalid(t != Classic && t != Quorum, "WithQueueType", "unknown queue type %q (want %q or %q)", t, Classic, Quorum),
		func(c *config) { c.queueType = t })
}

// WithDeliveryLimit makes the broker itself dead-letter a message (into the
// dead-letter queue, reason delivery_limit in its x-death header) once it
// was delivered more than n times: the quorum queue argument
// x-delivery-limit. Default 0: no limit. It needs WithQueueType(Quorum).
//
// It is the guard against messages the client library cannot even parse:
// amqp091-go refuses a header table of more than 8192 entries or nested
// deeper than 32 levels and drops the whole connection, so the Consumer
// never sees the message to dead-letter it, and on a classic queue the
// broker redelivers it, and the connection drops, forever. With a delivery
// limit the broker parks it after n tries. After such a drop the Source
// consumes one message at a time until a message parses, then goes back to
// the full window, so the messages behind the unparseable one are not
// returned with it on every drop and do not reach the limit with it
// (Stats.Isolations counts those sessions). URL parameter: delivery_limit.
// An existing queue declared without it must be re-created (or given the
// limit by a policy, with WithDeclare(false)).
func WithDeliveryLimit(n int) Option {
	return option.Check(invalid(n < 0, "WithDeliveryLimit", "%d is negative", n),
		func(c *config) { c.deliveryLimit = n })
}

// WithMessageTTL keeps a message at most d in the queue and at most d in
// its dead-letter queue (x-message-ttl on both, whole milliseconds, at
// least 1ms): a message not consumed within d moves to the dead-letter
// queue, and one parked there is dropped d later. This bounds how long the
// broker can redeliver a message to 2 × d, the Source's redelivery horizon,
// which the Consumer compares with the store's retention (see
// core.WithStrictRetention); without it the horizon is unbounded. Default
// none. URL parameter: message_ttl (a Go duration). An existing queue
// declared without it must be re-created; a TTL given by a policy instead
// (with WithDeclare(false)) is invisible to the Source, whose horizon then
// stays unbounded.
func WithMessageTTL(d time.Duration) Option {
	return option.Check(invalid(d < time.Millisecond, "WithMessageTTL", "%v is under 1ms", d),
		func(c *config) { c.messageTTL = d })
}

// WithPolicyTTL tells the Source the message TTL a server policy gives
// the queue and its dead-letter queue, which a client cannot read: the
// redelivery horizon is then at most 2 × d. It is how an existing queue,
// whose arguments cannot change, gets a bounded horizon:
//
//	rabbitmqctl set_policy idemq-ttl '^(payments|payments\.dlq)$' '{"message-ttl":259200000}' --apply-to queues
//
// then policy_ttl=72h on the URL. Nothing is declared with it. Default
// none. URL parameter: policy_ttl (a Go duration).
func WithPolicyTTL(d time.Duration) Option {
	return option.Check(invalid(d < time.Millisecond, "WithPolicyTTL", "%v is under 1ms", d),
		func(c *config) { c.policyTTL = d })
}

// WithDeadLetterQueue names the dead-letter queue. Default "<queue>.dlq".
func WithDeadLetterQueue(name string) Option {
	return option.Check(nameErr("WithDeadLetterQueue", name), func(c *config) { c.deadLetterQueue = name })
}

// WithRetryQueue names the retry queue used by RetryViaQueue. Default
// "<queue>.retry".
func WithRetryQueue(name string) Option {
	return option.Check(nameErr("WithRetryQueue", name), func(c *config) { c.retryQueue = name })
}

// WithExchange names the exchange producers publish the queue's messages
// to, with the queue's name as routing key (what a Publisher opened with
// WithPublishExchange and WithRoutingKey(queue) sends). With WithDeclare
// (the default) Open declares it as a durable direct exchange unless it
// exists (an existing exchange of any type is kept) and binds the queue to
// it with the queue's name as binding key. Default "": the default
// exchange, where no binding is needed. URL parameter: exchange, so one URL
// serves core.OpenSource and core.OpenPublisher.
func WithExchange(name string) Option {
	return option.Check(shortErr("WithExchange", "name", name), func(c *config) { c.exchange = name })
}

// WithRetryMode chooses how Retry redelivers. Default RetryRequeue.
func WithRetryMode(m RetryMode) Option {
	return option.Check(invalid(m != RetryRequeue && m != RetryViaQueue, "WithRetryMode", "unknown mode %d", m),
		func(c *config) { c.retryMode = m })
}

// WithDeadLetterMode chooses how DeadLetter parks a message. Default
// DeadLetterRepublish.
func WithDeadLetterMode(m DeadLetterMode) Option {
	return option.Check(invalid(m != DeadLetterRepublish && m != DeadLetterReject, "WithDeadLetterMode", "unknown mode %d", m),
		func(c *config) { c.deadLetterMode = m })
}

// WithConsumerTag sets the AMQP consumer tag. Default: a unique tag chosen
// by amqp091-go.
func WithConsumerTag(tag string) Option {
	return option.Check(nil, func(c *config) { c.consumerTag = tag })
}

// WithConnectionName sets the connection_name client property shown by
// rabbitmqctl and the management UI. Default "idemq".
func WithConnectionName(name string) Option {
	return option.Check(invalid(name == "", "WithConnectionName", "empty name"),
		func(c *config) { c.connName = name })
}

// WithIDHeader names an AMQP header that holds the business id, for
// producers that cannot set the message_id property: amqp-tools'
// amqp-publish, NServiceBus ("NServiceBus.MessageId"), MassTransit
// ("MessageId"). The Source reads the id from that header first and falls
// back to the message_id property when the header is absent, so producers
// of either kind can share the queue. A string or byte-array value is the
// id as it is and an integer is rendered in decimal; a header of any other
// type (a boolean, float, decimal, timestamp, table or array) is not an id:
// the message gets no id, the Consumer dead-letters it, and the cause names
// the header and its type. Default "": the id is the message_id property
// only. URL parameter: id_header (for the Publisher too, which then writes
// the id in the header as well as in message_id).
func WithIDHeader(name string) Option {
	return option.Check(invalid(name == "", "WithIDHeader", "empty header name"),
		func(c *config) { c.idHeader = name })
}

// WithReconnectBackoff sets the bounds of the exponential backoff between
// reconnect rounds. Default 100ms doubling up to 2s, each wait spread by
// ±20% (and never above max).
//
// A lost connection is redialled at once, to the next node of the URL; a
// round is one dial of every node (and, once one answers, the declare and
// consume), and only a round that fails waits, 100ms, 200ms, 400ms, … up
// to max. The backoff starts over as soon as a session consumes again, so
// a later outage begins with quick retries. The low default cap keeps a
// broker (or a cluster node) that comes back from waiting more than about
// 2s for its consumers; raise it for many consumers of a broker that is
// slow to come back.
func WithReconnectBackoff(min, max time.Duration) Option {
	return option.Check(invalid(min <= 0 || max < min, "WithReconnectBackoff", "need 0 < min <= max, got %v, %v", min, max),
		func(c *config) { c.backoffMin, c.backoffMax = min, max })
}

// WithLogger sets the logger for reconnects and settlement trouble. It wins
// over the Consumer's logger (SetLogger) and the one core.OpenSource is
// given (core.WithAdapterLogger). Without any of them the Source logs to
// slog.Default().
func WithLogger(l *slog.Logger) Option {
	return option.Check(invalid(l == nil, "WithLogger", "nil logger"), func(c *config) { c.logger = l })
}

// WithDialConfig sets the amqp091-go connection config (TLS, heartbeat,
// SASL, properties). Default: amqp091-go's defaults. Its Recovery field
// must be nil: the Source reconnects by itself, and amqp091-go's channel
// recovery would let an old delivery tag reach a new channel.
func WithDialConfig(cfg amqp.Config) Option {
	return option.Check(invalid(cfg.Recovery != nil, "WithDialConfig", "Recovery must be nil (the Source reconnects itself)"),
		func(c *config) { c.dial, c.dialSet = cfg, true })
}

// checkName validates a queue name: AMQP short strings are at most 255
// bytes, and an empty name would make the broker invent one.
func checkName(name string) error {
	if name == "" {
		return errors.New("empty queue name")
	}
	if len(name) > 255 {
		return fmt.Errorf("queue name of %d bytes is longer than 255", len(name))
	}
	return nil
}
