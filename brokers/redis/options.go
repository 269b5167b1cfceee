package redis

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/internal/option"
)

// The fields of an entry the adapter reads and writes; every other field
// is a header.
const (
	// DefaultIDField holds the business id unless WithIDField names
	// another field.
	DefaultIDField = "idemq-id"
	// KeyField holds Message.Key.
	KeyField = "idemq-key"
	// BodyField holds Message.Body.
	BodyField = "body"
)

// Option configures a Source, Publisher or DeadLetters. Options are applied
// in order; an invalid value makes the constructor fail with an error
// naming the option (or, opened by URL, the parameter).
type Option func(*config) error

type config struct {
	client       goredis.UniversalClient
	user, pass   string
	tls          *tls.Config
	db           int
	group        string
	consumer     string
	start        string
	idField      string
	minIdle      time.Duration
	maxExtension time.Duration
	window       int
	poll         time.Duration
	dlq          string
	maxLen       int64
	maxAge       time.Duration
	logger       *slog.Logger
}

func set(name string, err error, f func(*config)) Option {
	return option.Set("redis", name, err, f)
}

func nonEmpty(what, v string) error {
	if v == "" {
		return errors.New("empty " + what)
	}
	return nil
}

// WithClient uses an open client instead of dialling addr; Close leaves it
// open, and WithAuth, WithTLS and WithDB are ignored. A Redis Cluster
// client needs the stream and its dead-letter stream in one hash slot
// (a {tag} in both names): DeadLetter writes both in one MULTI/EXEC.
func WithClient(c goredis.UniversalClient) Option {
	return set("WithClient", option.Present(c), func(cfg *config) { cfg.client = c })
}

// WithAuth authenticates as an ACL user with a password; user "" is the
// default user (AUTH with the password alone).
func WithAuth(user, password string) Option {
	return set("WithAuth", nil, func(c *config) { c.user, c.pass = user, password })
}

// WithTLS dials with TLS configured by tc.
func WithTLS(tc *tls.Config) Option {
	return set("WithTLS", option.Present(tc), func(c *config) { c.tls = tc })
}

// WithDB selects the logical database. Default 0.
func WithDB(n int) Option {
	return set("WithDB", option.AtLeast(n, 0), func(c *config) { c.db = n })
}

// WithGroup names the consumer group the Source reads with. Required for a
// Source; a Publisher and DeadLetters ignore it.
func WithGroup(g string) Option {
	return set("WithGroup", nonEmpty("group", g), func(c *config) { c.group = g })
}

// WithConsumer names the Source within its group. Default the host name.
// Sources sharing a name share nothing but the name in XINFO and XPENDING.
func WithConsumer(name string) Option {
	return set("WithConsumer", nonEmpty("consumer", name), func(c *config) { c.consumer = name })
}

// WithStart is where a group the Source creates starts reading: "0", the
// default, from the stream's first entry (nothing published before the
// first consumer is lost), or "$" from the entries added after it. An
// existing group keeps its position.
func WithStart(id string) Option {
	var err error
	if id != "0" && id != "$" {
		err = errors.New(`not "0" or "$"`)
	}
	return set("WithStart", err, func(c *config) { c.start = id })
}

// WithIDField names the field that holds the business id. Default
// idemq-id.
func WithIDField(f string) Option {
	return set("WithIDField", nonEmpty("field name", f), func(c *config) { c.idField = f })
}

// WithMinIdle sets the lease: an entry pending this long without a
// heartbeat is reclaimed (XAUTOCLAIM) by a Source of the group, and a
// Retry delay is at most this long. Give every Source of a group the same
// value. Default 30s.
func WithMinIdle(d time.Duration) Option {
	return set("WithMinIdle", option.AtLeast(d, 100*time.Millisecond), func(c *config) { c.minIdle = d })
}

// WithMaxExtension caps how long after its receipt the heartbeat keeps an
// entry; after that it is reclaimed. Default 1h.
func WithMaxExtension(d time.Duration) Option {
	return set("WithMaxExtension", option.Positive(d), func(c *config) { c.maxExtension = d })
}

// WithWindow bounds the entries a Source holds unsettled. Default 100; the
// Consumer sets its own (driver.WindowSetter).
func WithWindow(n int) Option {
	return set("WithWindow", option.Positive(n), func(c *config) { c.window = n })
}

// WithPoll is the longest XREADGROUP block, and how often a Source looks
// for idle entries to reclaim. Default 500ms.
func WithPoll(d time.Duration) Option {
	return set("WithPoll", option.AtLeast(d, 10*time.Millisecond), func(c *config) { c.poll = d })
}

// WithDeadLetterStream names the stream dead letters are added to.
// Default STREAM:dlq.
func WithDeadLetterStream(name string) Option {
	return set("WithDeadLetterStream", nonEmpty("stream name", name), func(c *config) { c.dlq = name })
}

// WithMaxLen trims the streams the adapter adds to (MAXLEN ~ n): the
// stream by the Publisher and Redrive, the dead-letter stream by
// DeadLetter. An entry trimmed before it is settled is lost. It does not
// bound the redelivery horizon. Excludes WithMaxAge.
func WithMaxLen(n int64) Option {
	return set("WithMaxLen", option.Positive(n), func(c *config) { c.maxLen = n })
}

// WithMaxAge trims, as WithMaxLen does, the entries older than d (MINID ~,
// the entry ids being times). The redelivery horizon is then twice d (the
// stream and the dead-letter stream). Excludes WithMaxLen.
func WithMaxAge(d time.Duration) Option {
	return set("WithMaxAge", option.AtLeast(d, time.Second), func(c *config) { c.maxAge = d })
}

// WithLogger sets the logger for heartbeat, claim and give-back troubles.
// Default the Consumer's (driver.LoggerSetter), else slog.Default().
func WithLogger(l *slog.Logger) Option {
	return set("WithLogger", option.Present(l), func(c *config) { c.logger = l })
}

// resolve applies opts for stream and fills the defaults that depend on it.
func resolve(stream string, needGroup bool, opts []Option) (config, error) {
	c := config{start: "0", idField: DefaultIDField, minIdle: 30 * time.Second, maxExtension: time.Hour, window: 100, poll: 500 * time.Millisecond}
	if stream == "" {
		return c, errors.New("redis: no stream named")
	}
	if err := option.Apply(&c, opts...); err != nil {
		return c, err
	}
	switch {
	case needGroup && c.group == "":
		return c, errors.New("redis: a consumer group is required (WithGroup, or group= in the URL)")
	case c.maxLen > 0 && c.maxAge > 0:
		return c, errors.New("redis: max_len (WithMaxLen) and max_age (WithMaxAge) exclude each other")
	}
	if c.consumer == "" {
		c.consumer, _ = os.Hostname()
		if c.consumer == "" {
			c.consumer = "idemq"
		}
	}
	if c.dlq == "" {
		c.dlq = stream + ":dlq"
	}
	if c.dlq == stream {
		return c, errors.New("redis: the dead-letter stream is the stream itself")
	}
	return c, nil
}
