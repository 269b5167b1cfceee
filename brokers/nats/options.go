package nats

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/idemq/idemq/internal/option"
)

// DefaultIDHeader is the header the Source reads a message's business id
// from unless WithIDHeader names another: JetStream's own publish-side
// deduplication id.
const DefaultIDHeader = natsgo.MsgIdHdr

// Headers the adapter reads and writes beside the id header.
const (
	// IDHeader, when present, holds the business id and takes precedence
	// over the id header. Redrive puts the id there, because JetStream
	// drops a publish whose Nats-Msg-Id it has seen within the stream's
	// duplicate window.
	IDHeader = "idemq-id"
	// KeyHeader carries Message.Key.
	KeyHeader = "idemq-key"
	// AttemptHeader on a parked copy is the attempt it was parked on.
	AttemptHeader = "idemq-attempt"
	// OriginHeader on a parked copy is STREAM/CONSUMER/SEQUENCE of the
	// original.
	OriginHeader = "idemq-origin"
	// ParkedAtHeader on a parked copy is when it was parked (RFC 3339).
	ParkedAtHeader = "idemq-parked-at"
	// SubjectHeader on a parked copy is the subject the original was
	// consumed from, where Redrive publishes it.
	SubjectHeader = "idemq-subject"
)

// Option configures a Source, Publisher or DeadLetters. Options are applied
// in order; an invalid value makes the constructor fail with an error
// naming the option (or, for a URL, the parameter).
type Option func(*config) error

type config struct {
	conn         *natsgo.Conn
	servers      []string
	natsOpts     []natsgo.Option
	consumer     string
	subject      string
	declare      bool
	idHeader     string
	ackWait      time.Duration
	heartbeat    bool
	maxExtension time.Duration
	window       int
	dlqStream    string
	dlqSubject   string
	logger       *slog.Logger // nil: the Consumer's, or slog.Default()
	byURL        bool
}

func defaultConfig() config {
	return config{
		servers:      []string{natsgo.DefaultURL},
		declare:      true,
		idHeader:     DefaultIDHeader,
		ackWait:      30 * time.Second,
		heartbeat:    true,
		maxExtension: time.Hour,
		window:       100,
	}
}

// set returns the Option named name: applied, it fails naming the option
// (or its URL parameter) when err is not nil, and otherwise calls f.
func set(name string, err error, f func(*config)) Option {
	return func(c *config) error {
		if err != nil {
			if p, ok := urlParams.NameOf(name); ok && c.byURL {
				return fmt.Errorf("nats URL parameter %s: %v", p, err)
			}
			return option.Errorf("nats", name, "%v", err)
		}
		f(c)
		return nil
	}
}

func name(v string) error {
	if v == "" || strings.ContainsAny(v, " \t\r\n.*>") {
		return fmt.Errorf("%q is not a JetStream name (non-empty, no spaces, '.', '*' or '>')", v)
	}
	return nil
}

func subject(v string) error {
	if v == "" || strings.ContainsAny(v, " \t\r\n") || strings.HasPrefix(v, ".") || strings.HasSuffix(v, ".") || strings.Contains(v, "..") {
		return fmt.Errorf("%q is not a NATS subject", v)
	}
	return nil
}

// WithConn uses an open connection instead of dialling one; Close leaves
// it open. Servers and connection options are then ignored.
func WithConn(nc *natsgo.Conn) Option {
	return set("WithConn", option.NotNil(nc != nil, "connection"), func(c *config) { c.conn = nc })
}

// WithServers sets the servers to dial. Default nats://127.0.0.1:4222.
func WithServers(urls ...string) Option {
	var err error
	if len(urls) == 0 {
		err = errors.New("no servers")
	}
	return set("WithServers", err, func(c *config) { c.servers = urls })
}

// WithNATSOptions adds nats.go connection options (authentication, TLS,
// reconnect policy, …) to the dialled connection. Default: nats.go's
// defaults plus endless reconnects.
func WithNATSOptions(opts ...natsgo.Option) Option {
	return set("WithNATSOptions", nil, func(c *config) { c.natsOpts = append(c.natsOpts, opts...) })
}

// WithConsumer names the durable pull consumer the Source consumes with
// and whose dead letters DeadLetters reads. Required for a Source and
// DeadLetters; a Publisher ignores it.
func WithConsumer(v string) Option {
	return set("WithConsumer", name(v), func(c *config) { c.consumer = v })
}

// WithSubject sets the subject: the Source's consumer filter (wildcards
// allowed), where a Publisher publishes when the destination is "", and
// the subject of a stream the adapter declares. Default the stream's name.
func WithSubject(v string) Option {
	return set("WithSubject", subject(v), func(c *config) { c.subject = v })
}

// WithDeclare chooses whether the Source creates the stream (file storage,
// the subject only) and the dead-letter stream when they are missing, and
// creates or updates the consumer. Default true; with false, all three
// must exist, and opening fails naming the one that does not.
func WithDeclare(b bool) Option {
	return set("WithDeclare", nil, func(c *config) { c.declare = b })
}

// WithIDHeader names the header the business id is read from (and that a
// Publisher sets beside Nats-Msg-Id). Default Nats-Msg-Id. The idemq-id
// header, when present, takes precedence.
func WithIDHeader(h string) Option {
	var err error
	if h == "" || strings.ContainsAny(h, " :\r\n") {
		err = fmt.Errorf("%q is not a header name", h)
	}
	return set("WithIDHeader", err, func(c *config) { c.idHeader = h })
}

// WithAckWait sets the declared consumer's AckWait: how long JetStream
// waits for a settlement (or a heartbeat) before it redelivers. Default
// 30s. A consumer that is not declared keeps its own.
func WithAckWait(d time.Duration) Option {
	return set("WithAckWait", option.AtLeast(d, 100*time.Millisecond), func(c *config) { c.ackWait = d })
}

// WithHeartbeat chooses whether the Source keeps unsettled deliveries
// leased with InProgress every third of the AckWait. Default true.
func WithHeartbeat(b bool) Option {
	return set("WithHeartbeat", nil, func(c *config) { c.heartbeat = b })
}

// WithMaxExtension caps how long after its receipt the heartbeat keeps a
// delivery leased; after that JetStream redelivers it. Default 1h.
func WithMaxExtension(d time.Duration) Option {
	return set("WithMaxExtension", option.Positive(d), func(c *config) { c.maxExtension = d })
}

// WithWindow sets the declared consumer's MaxAckPending and the client's
// pull buffer: at most this many deliveries are unsettled at once. Default
// 100; the Consumer sets its own window (driver.WindowSetter).
func WithWindow(n int) Option {
	return set("WithWindow", option.Positive(n), func(c *config) { c.window = n })
}

// WithDeadLetterStream names the stream dead-lettered copies are
// published to. Default <STREAM>_DLQ.
func WithDeadLetterStream(v string) Option {
	return set("WithDeadLetterStream", name(v), func(c *config) { c.dlqStream = v })
}

// WithDeadLetterSubject sets the subject dead-lettered copies are
// published on; it must not be one of the consumed stream's subjects.
// Default idemq.dlq.<STREAM>.<CONSUMER>.
func WithDeadLetterSubject(v string) Option {
	var err error
	if err = subject(v); err == nil && strings.ContainsAny(v, "*>") {
		err = fmt.Errorf("%q has a wildcard", v)
	}
	return set("WithDeadLetterSubject", err, func(c *config) { c.dlqSubject = v })
}

// WithLogger sets the logger for reconnects and failed settlements or
// heartbeats. Default slog.Default(), or the Consumer's logger
// (driver.LoggerSetter) when none is set.
func WithLogger(l *slog.Logger) Option {
	return set("WithLogger", option.NotNil(l != nil, "logger"), func(c *config) { c.logger = l })
}

// resolve applies opts for stream and fills the defaults that depend on it.
func resolve(stream string, needConsumer bool, opts []Option) (config, error) {
	c := defaultConfig()
	if err := name(stream); err != nil {
		return c, fmt.Errorf("nats: stream: %w", err)
	}
	if err := option.Apply(&c, opts...); err != nil {
		return c, err
	}
	if needConsumer && c.consumer == "" {
		return c, errors.New(c.spell("nats: a consumer is required (WithConsumer)", "nats URL has no consumer (add ?consumer=NAME)"))
	}
	if c.subject == "" {
		c.subject = stream
	}
	if c.dlqStream == "" {
		c.dlqStream = stream + "_DLQ"
	}
	if c.dlqSubject == "" && c.consumer != "" {
		c.dlqSubject = "idemq.dlq." + stream + "." + c.consumer
	}
	return c, nil
}

func (c *config) spell(goForm, urlForm string) string {
	if c.byURL {
		return urlForm
	}
	return goForm
}
