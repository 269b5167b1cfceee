package kafka

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/redact"
)

// Ordering says which messages of one partition may be in flight together.
type Ordering int

const (
	// OrderPerKey hands out a message only when no earlier message with the
	// same Kafka key is in flight or waiting for a retry, so per-key order
	// holds while different keys of a partition are processed concurrently.
	// Messages without a key are independent of each other. Default. A
	// batch then holds at most one message of a key, so a hot key does not
	// batch.
	OrderPerKey Ordering = iota + 1
	// OrderPerPartition hands out one message of a partition at a time, in
	// offset order: a retried message holds up its whole partition (other
	// partitions go on).
	OrderPerPartition
	// OrderNone hands out messages of a partition concurrently in any
	// order. The committed offset still never passes an undecided message.
	OrderNone
)

// String names the ordering.
func (o Ordering) String() string {
	switch o {
	case OrderPerKey:
		return "per-key"
	case OrderPerPartition:
		return "per-partition"
	case OrderNone:
		return "none"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// Option configures a Source or a Publisher. Options are applied in order;
// an invalid value makes Open (or NewPublisher) fail with an error naming
// the option. Options that make no sense for a Publisher are ignored by it.
type Option func(*config) error

type config struct {
	brokers           []string
	topic             string
	group             string
	idHeader          string
	ordering          Ordering
	commitInterval    time.Duration
	commitCount       int
	revokeTimeout     time.Duration
	sessionTimeout    time.Duration
	heartbeatInterval time.Duration
	rebalanceTimeout  time.Duration
	joinBackoff       time.Duration
	startOffset       int64
	deadLetterTopic   string
	retryTopic        string
	partitionBuffer   int
	fetchMaxWait      time.Duration
	dialer            *kafkago.Dialer
	balancers         []kafkago.GroupBalancer
	logger            *slog.Logger
	batchTimeout      time.Duration
}

func defaultConfig() config {
	return config{
		idHeader:          DefaultIDHeader,
		ordering:          OrderPerKey,
		commitInterval:    time.Second,
		commitCount:       1000,
		revokeTimeout:     10 * time.Second,
		sessionTimeout:    30 * time.Second,
		heartbeatInterval: 3 * time.Second,
		rebalanceTimeout:  30 * time.Second,
		joinBackoff:       time.Second,
		startOffset:       kafkago.FirstOffset,
		partitionBuffer:   1000,
		fetchMaxWait:      500 * time.Millisecond,
		logger:            slog.Default(),
		batchTimeout:      2 * time.Millisecond,
	}
}

func optErr(name, format string, args ...any) error {
	return fmt.Errorf("kafka: option %s: %s", name, fmt.Sprintf(format, args...))
}

// DefaultIDHeader is the header the business id is read from (and written
// to by the Publisher) unless WithIDHeader says otherwise.
const DefaultIDHeader = "message-id"

// WithTopic sets the topic to consume (or, for a Publisher, the topic
// Publish uses when given ""). Default: the path of a kafka:// URL.
// Required for a Source.
func WithTopic(topic string) Option {
	return func(c *config) error {
		if err := checkTopic(topic); err != nil {
			return optErr("WithTopic", "%v", err)
		}
		c.topic = topic
		return nil
	}
}

// WithGroup sets the consumer group id. Default: the "group" query
// parameter of a kafka:// URL. Required for a Source. It is unrelated to
// the idemq consumer name (core.WithName), though using the same string
// for both is natural.
func WithGroup(group string) Option {
	return func(c *config) error {
		if group == "" || len(group) > 255 {
			return optErr("WithGroup", "group id must be 1..255 bytes, got %d", len(group))
		}
		c.group = group
		return nil
	}
}

// WithIDHeader names the Kafka header that holds the business id. Default
// "message-id". Producers following CloudEvents' Kafka binding put the
// event id in "ce_id": WithIDHeader("ce_id") reads it from there. For ids
// that need more than one header, use core.WithIDFunc.
func WithIDHeader(name string) Option {
	return func(c *config) error {
		if name == "" {
			return optErr("WithIDHeader", "empty header name")
		}
		c.idHeader = name
		return nil
	}
}

// WithOrdering sets which messages of a partition may be in flight
// together. Default OrderPerKey.
func WithOrdering(o Ordering) Option {
	return func(c *config) error {
		if o != OrderPerKey && o != OrderPerPartition && o != OrderNone {
			return optErr("WithOrdering", "unknown ordering %d", int(o))
		}
		c.ordering = o
		return nil
	}
}

// WithCommit sets how offset commits are batched: the decided prefix of
// every partition is committed every interval, and sooner once count
// messages were decided since the last commit. Commits are also flushed
// when partitions are revoked and on Close. Default 1s and 1000. A
// message decided but not yet committed when the process dies is
// redelivered and decided Duplicate, so these trade broker round trips
// against redelivered duplicates after a crash, never correctness.
func WithCommit(interval time.Duration, count int) Option {
	return func(c *config) error {
		if interval < time.Millisecond || interval > time.Hour {
			return optErr("WithCommit", "interval %v is outside 1ms..1h", interval)
		}
		if count < 1 {
			return optErr("WithCommit", "count %d must be at least 1", count)
		}
		c.commitInterval, c.commitCount = interval, count
		return nil
	}
}

// WithRevokeTimeout bounds how long, when a rebalance revokes this
// member's partitions, deliveries already handed out may take to be
// settled before the decided prefix is committed and the partitions are
// released. Settling them later returns ErrStaleDelivery (the new owner
// gets the message again and decides Duplicate if it was committed).
// Default 10s. It must be shorter than the rebalance timeout.
func WithRevokeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return optErr("WithRevokeTimeout", "%v is negative", d)
		}
		c.revokeTimeout = d
		return nil
	}
}

// WithGroupTimeouts sets the consumer group's session timeout (how long
// the coordinator waits for a heartbeat before declaring the member dead),
// heartbeat interval (also how soon a rebalance is noticed) and rebalance
// timeout (how long the coordinator waits for members to rejoin). Default
// 30s, 3s, 30s, as in kafka-go. The broker bounds the session timeout
// (group.min/max.session.timeout.ms).
func WithGroupTimeouts(session, heartbeat, rebalance time.Duration) Option {
	return func(c *config) error {
		if heartbeat <= 0 || session <= heartbeat {
			return optErr("WithGroupTimeouts", "need 0 < heartbeat (%v) < session (%v)", heartbeat, session)
		}
		if rebalance <= 0 {
			return optErr("WithGroupTimeouts", "rebalance timeout %v must be positive", rebalance)
		}
		c.sessionTimeout, c.heartbeatInterval, c.rebalanceTimeout = session, heartbeat, rebalance
		return nil
	}
}

// WithJoinBackoff sets how long the group waits before joining again after
// a failed join. Default 1s.
func WithJoinBackoff(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return optErr("WithJoinBackoff", "%v must be positive", d)
		}
		c.joinBackoff = d
		return nil
	}
}

// WithStartOffset sets where a partition without a committed offset
// starts: kafka-go's FirstOffset (the default: nothing published before
// the group first joined is skipped) or LastOffset.
func WithStartOffset(offset int64) Option {
	return func(c *config) error {
		if offset != kafkago.FirstOffset && offset != kafkago.LastOffset {
			return optErr("WithStartOffset", "%d is neither FirstOffset (-2) nor LastOffset (-1)", offset)
		}
		c.startOffset = offset
		return nil
	}
}

// WithDeadLetterTopic names the topic DeadLetter produces to. Default
// "<topic>.dlq". The topic must exist unless the cluster creates topics on
// first use; while it cannot be written, dead-lettered messages are
// retried in place and never dropped.
func WithDeadLetterTopic(topic string) Option {
	return func(c *config) error {
		if err := checkTopic(topic); err != nil {
			return optErr("WithDeadLetterTopic", "%v", err)
		}
		c.deadLetterTopic = topic
		return nil
	}
}

// WithRetryTopic makes Retry produce a copy of the message to topic (with
// the attempt and the time it may be processed in headers), wait for the
// write, and mark the original done, instead of retrying in place. The
// Source then also consumes topic in the same group and holds each copy
// until its time. Use it when one failing message must not hold up its
// partition's committed offset. A retried message then no longer holds up
// later messages of its key: per-key order is given up for it. Default:
// retry in place.
func WithRetryTopic(topic string) Option {
	return func(c *config) error {
		if err := checkTopic(topic); err != nil {
			return optErr("WithRetryTopic", "%v", err)
		}
		c.retryTopic = topic
		return nil
	}
}

// WithPartitionBuffer bounds the messages of one partition held between
// fetch and commit (waiting, in flight, or decided behind an undecided
// one): fetching from a partition pauses at the bound. Default 1000.
func WithPartitionBuffer(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 1_000_000 {
			return optErr("WithPartitionBuffer", "%d is outside 1..1000000", n)
		}
		c.partitionBuffer = n
		return nil
	}
}

// WithDialer sets the kafka-go dialer for every connection (TLS, SASL,
// client id, timeouts, a custom DialFunc). Default kafka-go's
// DefaultDialer. The DLQ, retry-topic and Publisher writers use its TLS,
// SASL, client id and DialFunc too.
func WithDialer(d *kafkago.Dialer) Option {
	return func(c *config) error {
		if d == nil {
			return optErr("WithDialer", "nil dialer")
		}
		c.dialer = d
		return nil
	}
}

// WithGroupBalancers sets the partition assignment strategies offered to
// the group, in order of preference (every member must offer the one
// chosen). Default kafka-go's: range, then round robin.
func WithGroupBalancers(bs ...kafkago.GroupBalancer) Option {
	return func(c *config) error {
		if len(bs) == 0 {
			return optErr("WithGroupBalancers", "no balancer given")
		}
		for i, b := range bs {
			if b == nil {
				return optErr("WithGroupBalancers", "balancer %d is nil", i)
			}
		}
		c.balancers = bs
		return nil
	}
}

// WithLogger sets the logger for rebalances, commit failures and fetch
// trouble. Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return optErr("WithLogger", "nil logger")
		}
		c.logger = l
		return nil
	}
}

// WithBatchTimeout sets how long the Publisher's (and the DLQ's) writer
// waits to fill a batch before sending it. Default 2ms; kafka-go's own
// default of 1s would delay every small synchronous write by a second.
func WithBatchTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 || d > time.Minute {
			return optErr("WithBatchTimeout", "%v is outside (0, 1m]", d)
		}
		c.batchTimeout = d
		return nil
	}
}

// checkTopic applies Kafka's topic name rules.
func checkTopic(t string) error {
	if t == "" {
		return errors.New("empty topic name")
	}
	if len(t) > 249 {
		return fmt.Errorf("topic name of %d bytes is longer than 249", len(t))
	}
	if t == "." || t == ".." {
		return fmt.Errorf("topic name %q is not allowed", t)
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("topic name holds %q; only [a-zA-Z0-9._-] are allowed", r)
		}
	}
	return nil
}

// parseTarget reads either a kafka:// URL or a plain comma-separated
// broker list (see Open): the brokers go into c, and the URL's topic,
// group and parameters come back as options to apply after the caller's.
func parseTarget(target string, c *config) ([]Option, error) {
	target = strings.TrimSpace(target)
	if target == "" {
		return nil, errors.New("kafka: brokers: empty URL or broker list")
	}
	hosts := target
	var opts []Option
	if strings.Contains(target, "://") {
		u, err := redact.ParseURL(target)
		if err != nil {
			return nil, fmt.Errorf("kafka: url: %w", err)
		}
		if u.Scheme != "kafka" {
			return nil, fmt.Errorf("kafka: url: scheme %q, want kafka://", u.Scheme)
		}
		if u.User != nil {
			// Not used, so not silently ignored either.
			return nil, errors.New("kafka: url: a user name or password is not read from the URL; set SASL with WithDialer")
		}
		hosts = u.Host
		if topic := strings.Trim(u.Path, "/"); topic != "" {
			if err := checkTopic(topic); err != nil {
				return nil, fmt.Errorf("kafka: url: topic: %w", err)
			}
			opts = append(opts, WithTopic(topic))
		}
		q, err := redact.ParseQuery(u.RawQuery) // u.Query() would drop a pair with a ';' silently
		if err != nil {
			return nil, fmt.Errorf("kafka: url parameters: %w", err)
		}
		qopts, err := queryOptions(q)
		if err != nil {
			return nil, err
		}
		opts = append(opts, qopts...)
	}
	for _, h := range strings.Split(hosts, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if strings.Contains(h, "@") {
			// Never quote what may be credentials.
			return nil, errors.New("kafka: brokers: a broker address holds '@'; credentials go in a kafka:// URL")
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			var ae *net.AddrError
			if errors.As(err, &ae) {
				err = errors.New(ae.Err)
			}
			return nil, fmt.Errorf("kafka: brokers: %q: %w", h, err)
		}
		c.brokers = append(c.brokers, h)
	}
	if len(c.brokers) == 0 {
		return nil, errors.New("kafka: brokers: no host:port in the URL or broker list")
	}
	return opts, nil
}

func queryOptions(q url.Values) ([]Option, error) {
	var opts []Option
	interval, count := time.Duration(0), 0
	for k, vs := range q {
		if len(vs) != 1 {
			return nil, fmt.Errorf("kafka: url parameter %s: given %d times", redact.Name(k), len(vs))
		}
		v := vs[0]
		bad := func(want string) error { return fmt.Errorf("kafka: url parameter %s: not %s", k, want) }
		switch k {
		case "group":
			opts = append(opts, WithGroup(v))
		case "id_header":
			opts = append(opts, WithIDHeader(v))
		case "ordering":
			o, ok := map[string]Ordering{"per-key": OrderPerKey, "per-partition": OrderPerPartition, "none": OrderNone}[v]
			if !ok {
				return nil, bad("per-key, per-partition or none")
			}
			opts = append(opts, WithOrdering(o))
		case "dead_letter_topic":
			opts = append(opts, WithDeadLetterTopic(v))
		case "retry_topic":
			opts = append(opts, WithRetryTopic(v))
		case "start":
			switch v {
			case "first":
				opts = append(opts, WithStartOffset(kafkago.FirstOffset))
			case "last":
				opts = append(opts, WithStartOffset(kafkago.LastOffset))
			default:
				return nil, bad("first or last")
			}
		case "commit_interval":
			d, err := time.ParseDuration(v)
			if err != nil {
				return nil, bad("a duration")
			}
			interval = d
		case "commit_count":
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, bad("a number")
			}
			count = n
		case "revoke_timeout":
			d, err := time.ParseDuration(v)
			if err != nil {
				return nil, bad("a duration")
			}
			opts = append(opts, WithRevokeTimeout(d))
		case "session_timeout", "heartbeat_interval", "rebalance_timeout":
			d, err := time.ParseDuration(v)
			if err != nil {
				return nil, bad("a duration")
			}
			key := k
			opts = append(opts, func(c *config) error {
				session, heartbeat, rebalance := c.sessionTimeout, c.heartbeatInterval, c.rebalanceTimeout
				switch key {
				case "session_timeout":
					session = d
				case "heartbeat_interval":
					heartbeat = d
				default:
					rebalance = d
				}
				return WithGroupTimeouts(session, heartbeat, rebalance)(c)
			})
		default:
			return nil, fmt.Errorf("kafka: url parameter %s: unknown", redact.Name(k))
		}
	}
	if interval != 0 || count != 0 {
		opts = append(opts, func(c *config) error {
			i, n := interval, count
			if i == 0 {
				i = c.commitInterval
			}
			if n == 0 {
				n = c.commitCount
			}
			return WithCommit(i, n)(c)
		})
	}
	return opts, nil
}
