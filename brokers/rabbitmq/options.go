package rabbitmq

import (
	"cmp"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/core/driver/option"
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

// RetryMode chooses how the Source retries a message.
type RetryMode int

const (
	// RetryRequeue leaves the message unacked while the Consumer waits out
	// the delay (it keeps its place in the window, which throttles a
	// failing consumer), then nacks it with requeue. Nothing is published.
	RetryRequeue RetryMode = iota + 1
	// RetryViaQueue publishes a copy to the retry queue with a per-message
	// TTL equal to the delay, confirmed, then acks the original; the retry
	// queue dead-letters the copy back to the main queue when the TTL
	// expires. The attempt travels in driver.AttemptHeader. RabbitMQ
	// expires messages only at the head of a queue, so a short delay can
	// wait behind a longer one.
	RetryViaQueue
)

// DeadLetterMode chooses how the Source parks a dead-lettered message.
type DeadLetterMode int

const (
	// DeadLetterRepublish publishes a copy to the dead-letter queue with
	// the cause in driver.CauseHeader (mandatory, confirmed), then acks
	// the original. If the copy cannot be routed, DeadLetter fails and the
	// message stays unacked: it is never dropped.
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
	dial     *amqp.Config // nil: amqp091-go's defaults
	idHeader string       // "" reads and writes the id in message_id only
}

func (c *connConfig) conn() *connConfig { return c }

// connOf is a Source's or a Publisher's config, by its connConfig.
type connOf[C any] interface {
	*C
	conn() *connConfig
}

// connName, idHeader and dialConfig return a Source's or a Publisher's
// option, named name, that sets its connConfig's field to v.
func connName[C any, P connOf[C]](name, v string) func(*C) error {
	return set(name, option.Refuse(v == "", "empty name"), func(c *C) { P(c).conn().connName = v })
}

func idHeader[C any, P connOf[C]](name, v string) func(*C) error {
	return set(name, option.Refuse(v == "", "empty header name"), func(c *C) { P(c).conn().idHeader = v })
}

func dialConfig[C any, P connOf[C]](name string, v amqp.Config) func(*C) error {
	return set(name, option.Refuse(v.Recovery != nil, "Recovery must be nil (idemq reconnects by itself)"),
		func(c *C) { P(c).conn().dial = &v })
}

type config struct {
	connConfig
	queue, deadLetterQueue, retryQueue, consumerTag, exchange string
	deliveryLimit                                             int
	declare                                                   bool
	queueType                                                 QueueType
	retryMode                                                 RetryMode
	deadLetterMode                                            DeadLetterMode
	backoffMin, backoffMax, messageTTL, policyTTL             time.Duration
	logger                                                    *slog.Logger // nil: the Consumer's
}

// defaultConfig is the configuration before options; the dead-letter and
// retry queues' names follow the queue's once the options are applied.
func defaultConfig(queue string) config {
	return config{
		connConfig:     connConfig{connName: "idemq"},
		queue:          queue,
		declare:        true,
		queueType:      Classic,
		retryMode:      RetryRequeue,
		deadLetterMode: DeadLetterRepublish,
		backoffMin:     100 * time.Millisecond,
		backoffMax:     2 * time.Second,
	}
}

// set returns the option name of a Source's or a Publisher's config:
// applied, it fails naming the option when err, the check of its value,
// is not nil, and otherwise calls f.
func set[C any](name string, err error, f func(*C)) func(*C) error {
	return option.Set("rabbitmq", name, err, f)
}

// short checks an AMQP short string (an exchange name or routing key, at
// most 255 bytes).
func short(what, v string) error {
	return option.Refuse(len(v) > 255, "%s of %d bytes is longer than 255", what, len(v))
}

// checkName checks a queue name: an empty one would make the broker
// invent one.
func checkName(name string) error {
	return cmp.Or(option.Refuse(name == "", "empty queue name"), short("queue name", name))
}

// WithQueue names the queue to consume, instead of the URL's queue
// parameter. One of them is required.
func WithQueue(name string) Option {
	return set("WithQueue", checkName(name), func(c *config) { c.queue = name })
}

// WithDeclare chooses whether Open declares the topology: the durable
// queue, dead-lettering through the default exchange to the dead-letter
// queue, the dead-letter queue, with RetryViaQueue the retry queue and,
// with WithExchange, the exchange and the queue's binding to it. Default
// true. Pass false when operators own the topology; it must then exist.
func WithDeclare(declare bool) Option {
	return set("WithDeclare", nil, func(c *config) { c.declare = declare })
}

// WithQueueType sets the type of the queues Open declares. Default Classic.
func WithQueueType(t QueueType) Option {
	return set("WithQueueType", option.Refuse(t != Classic && t != Quorum, "unknown queue type %q (want %q or %q)", t, Classic, Quorum),
		func(c *config) { c.queueType = t })
}

// WithDeliveryLimit makes the broker itself dead-letter a message (reason
// delivery_limit in x-death) once it was delivered more than n times: the
// quorum queue argument x-delivery-limit. Default 0: no limit. It needs
// WithQueueType(Quorum); an existing queue declared without it must be
// re-created, or given the limit by a policy with WithDeclare(false).
//
// It guards against messages the client library cannot parse: amqp091-go
// drops the whole connection on a header table of more than 8192 entries
// or nested deeper than 32 levels, so the Consumer never sees the message
// to dead-letter it, and the broker redelivers it forever. After such a
// drop the Source consumes one message at a time until a message parses
// (Stats.Isolations), so the messages behind the unparseable one do not
// reach the limit with it.
func WithDeliveryLimit(n int) Option {
	return set("WithDeliveryLimit", option.AtLeast(n, 0), func(c *config) { c.deliveryLimit = n })
}

// WithMessageTTL keeps a message at most d in the queue and at most d in
// its dead-letter queue (x-message-ttl on both, whole milliseconds, at
// least 1ms), which bounds the Source's redelivery horizon to 2 × d (see
// core.WithStrictRetention). Default none: unbounded. An existing queue
// declared without it must be re-created, or given the TTL by a policy
// (see WithPolicyTTL).
func WithMessageTTL(d time.Duration) Option {
	return set("WithMessageTTL", option.AtLeast(d, time.Millisecond), func(c *config) { c.messageTTL = d })
}

// WithPolicyTTL tells the Source the message TTL a server policy gives
// the queue and its dead-letter queue, which a client cannot read: the
// redelivery horizon is then at most 2 × d. Nothing is declared with it.
// It is how an existing queue, whose arguments cannot change, gets a
// bounded horizon:
//
//	rabbitmqctl set_policy idemq-ttl '^(payments|payments\.dlq)$' '{"message-ttl":259200000}' --apply-to queues
func WithPolicyTTL(d time.Duration) Option {
	return set("WithPolicyTTL", option.AtLeast(d, time.Millisecond), func(c *config) { c.policyTTL = d })
}

// WithDeadLetterQueue names the dead-letter queue. Default "<queue>.dlq".
func WithDeadLetterQueue(name string) Option {
	return set("WithDeadLetterQueue", checkName(name), func(c *config) { c.deadLetterQueue = name })
}

// WithRetryQueue names the retry queue used by RetryViaQueue. Default
// "<queue>.retry".
func WithRetryQueue(name string) Option {
	return set("WithRetryQueue", checkName(name), func(c *config) { c.retryQueue = name })
}

// WithExchange names the exchange producers publish the queue's messages
// to, with the queue's name as routing key, as a Publisher opened by the
// same URL does. With WithDeclare Open declares it as a durable direct
// exchange unless it exists (of any type) and binds the queue to it with
// the queue's name. Default "": the default exchange, where no binding is
// needed.
func WithExchange(name string) Option {
	return set("WithExchange", short("name", name), func(c *config) { c.exchange = name })
}

// WithRetryMode chooses how Retry redelivers. Default RetryRequeue.
func WithRetryMode(m RetryMode) Option {
	return set("WithRetryMode", option.Refuse(m != RetryRequeue && m != RetryViaQueue, "unknown mode %d", m), func(c *config) { c.retryMode = m })
}

// WithDeadLetterMode chooses how DeadLetter parks a message. Default
// DeadLetterRepublish.
func WithDeadLetterMode(m DeadLetterMode) Option {
	return set("WithDeadLetterMode", option.Refuse(m != DeadLetterRepublish && m != DeadLetterReject, "unknown mode %d", m),
		func(c *config) { c.deadLetterMode = m })
}

// WithConsumerTag sets the AMQP consumer tag. Default "idemq": a tag need
// only be unique on its channel, and the Source consumes on one of its own.
func WithConsumerTag(tag string) Option {
	return set("WithConsumerTag", nil, func(c *config) { c.consumerTag = tag })
}

// WithConnectionName sets the connection_name client property shown by
// rabbitmqctl and the management UI. Default "idemq".
func WithConnectionName(name string) Option { return connName[config]("WithConnectionName", name) }

// WithIDHeader names an AMQP header that holds the business id, for
// producers that cannot set the message_id property (amqp-publish,
// NServiceBus's "NServiceBus.MessageId", MassTransit's "MessageId"). The
// Source reads the header first and falls back to message_id, so both
// kinds of producer can share the queue. A string or byte array is the id
// as it is, an integer is rendered in decimal; any other type is no id,
// and the Consumer dead-letters the message with a cause naming the header
// and its type. Default "": message_id only. A Publisher opened by the
// same URL writes the id in the header too.
func WithIDHeader(name string) Option { return idHeader[config]("WithIDHeader", name) }

// WithReconnectBackoff sets the bounds of the backoff between reconnect
// rounds, a round being one dial of every node (and, once one answers, the
// declare and consume). Default 100ms doubling up to 2s, each wait spread
// by ±20% and never above max; it starts over once a session consumes
// again. The low cap keeps consumers from waiting long for a broker that
// came back; raise it for many consumers of a broker slow to come back.
func WithReconnectBackoff(min, max time.Duration) Option {
	return set("WithReconnectBackoff", option.Refuse(min <= 0 || max < min, "need 0 < min <= max, got %v, %v", min, max),
		func(c *config) { c.backoffMin, c.backoffMax = min, max })
}

// WithLogger sets the logger for reconnects and settlement trouble. It wins
// over the Consumer's logger and the one core.OpenSource is given
// (core.WithAdapterLogger). Default: the Consumer's logger.
func WithLogger(l *slog.Logger) Option {
	return set("WithLogger", option.NotNil(l != nil, "logger"), func(c *config) { c.logger = l })
}

// WithDialConfig sets the amqp091-go connection config (TLS, heartbeat,
// SASL, properties). Default: amqp091-go's defaults. Its Recovery field
// must be nil: the Source reconnects by itself, and amqp091-go's channel
// recovery would let an old delivery tag reach a new channel.
func WithDialConfig(cfg amqp.Config) Option { return dialConfig[config]("WithDialConfig", cfg) }
