package rabbitmq

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
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
	// expires. The attempt travels in the x-idemq-attempt header. RabbitMQ
	// expires messages only at the head of a queue, so a short delay can
	// wait behind a longer one.
	RetryViaQueue
)

// DeadLetterMode chooses how Delivery.DeadLetter parks a message.
type DeadLetterMode int

const (
	// DeadLetterRepublish publishes a copy to the dead-letter queue with
	// the cause in the x-idemq-cause header (mandatory, confirmed), then
	// acks the original. If the copy cannot be routed, DeadLetter fails and
	// the message stays unacked: it is never dropped.
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

type config struct {
	prefetch        int
	declare         bool
	queueType       QueueType
	deadLetterQueue string
	retryQueue      string
	retryMode       RetryMode
	deadLetterMode  DeadLetterMode
	consumerTag     string
	connName        string
	backoffMin      time.Duration
	backoffMax      time.Duration
	logger          *slog.Logger
	dial            amqp.Config
	dialSet         bool
	deliveryLimit   int
}

func defaultConfig(queue string) config {
	return config{
		prefetch:        100,
		declare:         true,
		queueType:       Classic,
		deadLetterQueue: queue + ".dlq",
		retryQueue:      queue + ".retry",
		retryMode:       RetryRequeue,
		deadLetterMode:  DeadLetterRepublish,
		connName:        "idemq",
		backoffMin:      100 * time.Millisecond,
		backoffMax:      10 * time.Second,
		logger:          slog.Default(),
	}
}

// WithPrefetch sets the QoS prefetch count used until the Consumer calls
// SetWindow (which replaces it). Default 100. Must be 1..65535.
func WithPrefetch(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 65535 {
			return fmt.Errorf("rabbitmq: WithPrefetch: %d is outside 1..65535", n)
		}
		c.prefetch = n
		return nil
	}
}

// WithDeclare chooses whether Open declares the topology: the queue
// (durable, with the dead-letter queue as its dead-letter target through the
// default exchange), the dead-letter queue and, with RetryViaQueue, the
// retry queue. Default true. Pass false when operators own the topology;
// the queues must then exist.
func WithDeclare(declare bool) Option {
	return func(c *config) error {
		c.declare = declare
		return nil
	}
}

// WithQueueType sets the type of the queues Open declares. Default Classic.
func WithQueueType(t QueueType) Option {
	return func(c *config) error {
		if t != Classic && t != Quorum {
			return fmt.Errorf("rabbitmq: WithQueueType: unknown queue type %q (want %q or %q)", t, Classic, Quorum)
		}
		c.queueType = t
		return nil
	}
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
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("rabbitmq: WithDeliveryLimit: %d is negative", n)
		}
		c.deliveryLimit = n
		return nil
	}
}

// WithDeadLetterQueue names the dead-letter queue. Default "<queue>.dlq".
func WithDeadLetterQueue(name string) Option {
	return func(c *config) error {
		if err := checkName(name); err != nil {
			return fmt.Errorf("rabbitmq: WithDeadLetterQueue: %w", err)
		}
		c.deadLetterQueue = name
		return nil
	}
}

// WithRetryQueue names the retry queue used by RetryViaQueue. Default
// "<queue>.retry".
func WithRetryQueue(name string) Option {
	return func(c *config) error {
		if err := checkName(name); err != nil {
			return fmt.Errorf("rabbitmq: WithRetryQueue: %w", err)
		}
		c.retryQueue = name
		return nil
	}
}

// WithRetryMode chooses how Retry redelivers. Default RetryRequeue.
func WithRetryMode(m RetryMode) Option {
	return func(c *config) error {
		if m != RetryRequeue && m != RetryViaQueue {
			return fmt.Errorf("rabbitmq: WithRetryMode: unknown mode %d", m)
		}
		c.retryMode = m
		return nil
	}
}

// WithDeadLetterMode chooses how DeadLetter parks a message. Default
// DeadLetterRepublish.
func WithDeadLetterMode(m DeadLetterMode) Option {
	return func(c *config) error {
		if m != DeadLetterRepublish && m != DeadLetterReject {
			return fmt.Errorf("rabbitmq: WithDeadLetterMode: unknown mode %d", m)
		}
		c.deadLetterMode = m
		return nil
	}
}

// WithConsumerTag sets the AMQP consumer tag. Default: a unique tag chosen
// by amqp091-go.
func WithConsumerTag(tag string) Option {
	return func(c *config) error {
		c.consumerTag = tag
		return nil
	}
}

// WithConnectionName sets the connection_name client property shown by
// rabbitmqctl and the management UI. Default "idemq".
func WithConnectionName(name string) Option {
	return func(c *config) error {
		if name == "" {
			return errors.New("rabbitmq: WithConnectionName: empty name")
		}
		c.connName = name
		return nil
	}
}

// WithReconnectBackoff sets the bounds of the exponential backoff between
// reconnect attempts. Default 100ms doubling up to 10s, each wait spread
// by ±20%.
func WithReconnectBackoff(min, max time.Duration) Option {
	return func(c *config) error {
		if min <= 0 || max < min {
			return fmt.Errorf("rabbitmq: WithReconnectBackoff: need 0 < min <= max, got %v, %v", min, max)
		}
		c.backoffMin, c.backoffMax = min, max
		return nil
	}
}

// WithLogger sets the logger for reconnects and settlement trouble.
// Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("rabbitmq: WithLogger: nil logger")
		}
		c.logger = l
		return nil
	}
}

// WithDialConfig sets the amqp091-go connection config (TLS, heartbeat,
// SASL, properties). Default: amqp091-go's defaults. Its Recovery field
// must be nil: the Source reconnects by itself, and amqp091-go's channel
// recovery would let an old delivery tag reach a new channel.
func WithDialConfig(cfg amqp.Config) Option {
	return func(c *config) error {
		if cfg.Recovery != nil {
			return errors.New("rabbitmq: WithDialConfig: Recovery must be nil (the Source reconnects itself)")
		}
		c.dial = cfg
		c.dialSet = true
		return nil
	}
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
