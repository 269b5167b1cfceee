// Package redis is idemq's Redis Streams broker adapter, built on
// github.com/redis/go-redis/v9, for Redis 7.0 or later.
//
// A Source reads a stream as a member of a consumer group (XREADGROUP,
// explicit acks; Open creates the group with MKSTREAM). An entry holds a
// message in fields (see DefaultIDField), each header in a field of its
// own; Attempt is the entry's delivery count. Its methods say which Redis
// commands they send; dead letters go to the stream STREAM:dlq.
//
// Importing the package registers redis:// and rediss:// (TLS) with
// core.OpenSource, core.OpenPublisher and admin.OpenDeadLetters:
//
//	redis://[user:pass@]host:6379/STREAM?group=G&consumer=C&…
//
// The parameters are those of docs/brokers.md, each named in errors.
//
// Importing it also sets go-redis's process-wide logger (redis.SetLogger)
// to one that turns go-redis's own lines (a failed dial, a bad
// connection) into slog records: a line about a command of a Source,
// Publisher or DeadLetters goes to that one's logger, with its stream;
// any other to slog.Default(). A program that wants go-redis's lines
// elsewhere calls redis.SetLogger after the imports' init.
package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/core/driver/urlparam"
)

// The fields an entry holds a message in, every other field being a
// header: DefaultIDField the business id (unless WithIDField names another
// field), KeyField Message.Key, BodyField Message.Body (unless
// WithBodyField names another field).
const (
	DefaultIDField = "idemq-id"
	KeyField       = "idemq-key"
	BodyField      = "body"
)

// DefaultMinIdle is the lease of an entry when WithMinIdle is not given:
// a consumer that dies loses its entries to the group's live consumers
// within it (plus a poll), while the Consumer's heartbeat, every 0.3 of
// it, keeps a live consumer's entries through two failed beats in a row.
const DefaultMinIdle = 6 * time.Second

// Option configures a Source, Publisher or DeadLetters. Options apply in
// order; an invalid value makes the constructor fail naming the option (or,
// opened by URL, the parameter).
type Option func(*config) error

type config struct {
	user, pass, group, consumer, start, idField, bodyField, dlq string
	tls                                                         *tls.Config
	minIdle, maxExtension, poll, maxAge                         time.Duration
	maxLen                                                      int64
	logger                                                      *slog.Logger
}

func set(name string, err error, f func(*config)) Option { return option.Set("redis", name, err, f) }

func named(v string) error { return option.Refuse(v == "", "empty") }

// WithAuth authenticates as an ACL user; user "" is the default user.
func WithAuth(user, password string) Option {
	return set("WithAuth", nil, func(c *config) { c.user, c.pass = user, password })
}

// WithTLS dials with TLS configured by tc.
func WithTLS(tc *tls.Config) Option {
	return set("WithTLS", option.Present(tc), func(c *config) { c.tls = tc })
}

// WithGroup names the consumer group. Required for a Source.
func WithGroup(g string) Option { return set("WithGroup", named(g), func(c *config) { c.group = g }) }

// WithConsumer names the Source in its group. Default the host name.
func WithConsumer(v string) Option {
	return set("WithConsumer", named(v), func(c *config) { c.consumer = v })
}

// WithStart is the entry id after which a group the Source creates reads:
// "0" (the default) the whole stream, "$" what is added later.
func WithStart(id string) Option {
	return set("WithStart", named(id), func(c *config) { c.start = id })
}

// WithIDField names the field holding the business id. Default idemq-id.
func WithIDField(f string) Option {
	return set("WithIDField", named(f), func(c *config) { c.idField = f })
}

// WithBodyField names the field holding the body. Default body. An entry
// without it is dead-lettered with a cause naming the field.
func WithBodyField(f string) Option {
	return set("WithBodyField", named(f), func(c *config) { c.bodyField = f })
}

// WithMinIdle is the lease: an entry idle this long is reclaimed by the
// group (give every Source the same), and the longest Retry delay; the
// Consumer extends a held entry's lease, 0.9 of it, before it passes.
// Default DefaultMinIdle.
func WithMinIdle(d time.Duration) Option {
	return set("WithMinIdle", option.AtLeast(d, 100*time.Millisecond), func(c *config) { c.minIdle = d })
}

// WithMaxExtension caps how long after its receipt an entry's lease is
// extended (Traits.MaxExtension). Default 1h.
func WithMaxExtension(d time.Duration) Option {
	return set("WithMaxExtension", option.Positive(d), func(c *config) { c.maxExtension = d })
}

// WithPoll is the longest XREADGROUP block and the time between XAUTOCLAIMs
// that find nothing. Default 500ms.
func WithPoll(d time.Duration) Option {
	return set("WithPoll", option.AtLeast(d, 10*time.Millisecond), func(c *config) { c.poll = d })
}

// WithDeadLetterStream names the dead-letter stream. Default STREAM:dlq.
func WithDeadLetterStream(v string) Option {
	return set("WithDeadLetterStream", named(v), func(c *config) { c.dlq = v })
}

// WithMaxLen trims (MAXLEN ~ n) at each XADD of the Publisher, Redrive and
// DeadLetter; an entry trimmed unsettled is lost. Excludes WithMaxAge.
func WithMaxLen(n int64) Option {
	return set("WithMaxLen", option.Positive(n), func(c *config) { c.maxLen = n })
}

// WithMaxAge trims as WithMaxLen does the entries older than d (MINID ~),
// bounding the redelivery horizon to 2d.
func WithMaxAge(d time.Duration) Option {
	return set("WithMaxAge", option.AtLeast(d, time.Second), func(c *config) { c.maxAge = d })
}

// WithLogger sets the logger. Default the Consumer's, else slog.Default().
func WithLogger(l *slog.Logger) Option {
	return set("WithLogger", option.Present(l), func(c *config) { c.logger = l })
}

func init() {
	goredis.SetLogger(clientLogger{})
	for _, scheme := range []string{"redis", "rediss"} {
		driver.RegisterSource(scheme, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
			return Open(ctx, u.String(), driver.LoggerOption(cfg, WithLogger))
		})
		driver.RegisterPublisher(scheme, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Publisher, error) {
			return NewPublisher(ctx, u.String(), PublisherOption(driver.LoggerOption(cfg, WithLogger)))
		})
		driver.RegisterDeadLetters(scheme, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.DeadLetters, error) {
			return OpenDeadLetters(ctx, u.String(), driver.LoggerOption(cfg, WithLogger))
		})
	}
}

var file = urlparam.NonEmpty("", func(string) Option { return nil })

// urlParams are the URL parameters; every side checks all of them.
var urlParams = urlparam.Table[Option]{Scheme: "redis", Params: map[string]urlparam.Param[Option]{
	"group":         urlparam.NonEmpty("WithGroup", WithGroup),
	"consumer":      urlparam.NonEmpty("WithConsumer", WithConsumer),
	"start":         urlparam.NonEmpty("WithStart", WithStart),
	"id_field":      urlparam.NonEmpty("WithIDField", WithIDField),
	"id_header":     urlparam.NonEmpty("", WithIDField), // the name core's missing-id causes give
	"body_field":    urlparam.NonEmpty("WithBodyField", WithBodyField),
	"min_idle":      urlparam.Duration("WithMinIdle", WithMinIdle),
	"max_extension": urlparam.Duration("WithMaxExtension", WithMaxExtension),
	"poll":          urlparam.Duration("WithPoll", WithPoll),
	"dlq":           urlparam.NonEmpty("WithDeadLetterStream", WithDeadLetterStream),
	"max_len":       urlparam.Int("WithMaxLen", func(n int) Option { return WithMaxLen(int64(n)) }),
	"max_age":       urlparam.Duration("WithMaxAge", WithMaxAge),
	"tls_ca":        file,
	"tls_cert":      file,
	"tls_key":       file,
}}

// parseURL reads redis[s]://[user:pass@]host:6379/STREAM?group=G&… into
// the address, the stream and options.
func parseURL(raw string) (addr, stream string, opts []Option, err error) {
	u, err := urlparam.ParseURL(raw)
	if err != nil {
		return "", "", nil, fmt.Errorf("redis: %w", err)
	}
	stream, addr = strings.TrimPrefix(u.Path, "/"), u.Host
	if stream == "" || addr == "" || (u.Scheme != "redis" && u.Scheme != "rediss") {
		return "", "", nil, errors.New("redis URL needs the scheme redis:// or rediss://, a host and the stream as its path (redis://host:6379/STREAM?group=G)")
	}
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "6379")
	}
	if u.User != nil {
		pass, _ := u.User.Password()
		opts = append(opts, WithAuth(u.User.Username(), pass))
	}
	q, err := urlparam.ParseQuery(u.RawQuery)
	if err != nil {
		return "", "", nil, fmt.Errorf("redis URL parameters: %w", err)
	}
	read, err := urlParams.Read(q)
	if err == nil && u.Scheme == "rediss" {
		var tc *tls.Config
		tc, err = urlparam.TLSConfig("redis", u.Hostname(), urlparam.File{Param: "tls_ca", Path: q.Get("tls_ca")},
			urlparam.File{Param: "tls_cert", Path: q.Get("tls_cert")}, urlparam.File{Param: "tls_key", Path: q.Get("tls_key")})
		opts = append(opts, WithTLS(tc))
	} else if err == nil && q.Get("tls_ca")+q.Get("tls_cert")+q.Get("tls_key") != "" {
		err = errors.New("redis URL parameters tls_ca, tls_cert and tls_key need a rediss:// URL")
	}
	return addr, stream, append(opts, read...), err
}

// link is a client, its config, the stream and the logger.
type link struct {
	c      config
	rdb    *goredis.Client
	stream string
	log    atomic.Pointer[slog.Logger] // nil: slog.Default()
	// dialErr is the error of the last dial, nil once one succeeds.
	dialErr atomic.Pointer[string]
}

// resolve applies the URL's options, then opts, for stream over the
// defaults.
func resolve(stream string, needGroup bool, fromURL, opts []Option) (config, error) {
	c := config{start: "0", idField: DefaultIDField, bodyField: BodyField, dlq: stream + ":dlq", minIdle: DefaultMinIdle, maxExtension: time.Hour, poll: 500 * time.Millisecond}
	c.consumer, _ = os.Hostname()
	err := urlParams.Explain(option.Apply(&c, fromURL...))
	if err == nil {
		err = option.Apply(&c, opts...)
	}
	switch {
	case err != nil:
	case stream == "":
		err = errors.New("redis: no stream named")
	case needGroup && c.group == "":
		err = errors.New("redis: a consumer group is required (WithGroup, or group= in the URL)")
	case c.maxLen > 0 && c.maxAge > 0:
		err = errors.New("redis: max_len (WithMaxLen) and max_age (WithMaxAge) exclude each other")
	case c.dlq == stream:
		err = errors.New("redis: the dead-letter stream is the stream itself")
	case c.idField == c.bodyField || c.idField == KeyField || c.bodyField == KeyField:
		err = fmt.Errorf("redis: the id field %q (id_field=, WithIDField), the body field %q (body_field=, WithBodyField) and the key field %q must differ", c.idField, c.bodyField, KeyField)
	}
	return c, err
}

// connect reads the URL raw, applies opts after its parameters and dials,
// checking the server answers.
func connect(ctx context.Context, raw string, needGroup bool, opts []Option) (*link, error) {
	addr, stream, fromURL, err := parseURL(raw)
	if err != nil {
		return nil, err
	}
	c, err := resolve(stream, needGroup, fromURL, opts)
	if err != nil {
		return nil, err
	}
	l := &link{c: c, stream: stream}
	l.log.Store(c.logger)
	l.rdb = goredis.NewClient(&goredis.Options{Addr: addr, Username: c.user, Password: c.pass, TLSConfig: c.tls, ClientName: "idemq"})
	l.rdb.AddHook(clientLog{l})
	links.Store(l, nil)
	if err := l.rdb.Ping(ctx).Err(); err != nil {
		l.close()
		return nil, fmt.Errorf("redis: connecting to %s: %w", addr, err)
	}
	return l, nil
}

// logger returns the link's logger.
func (l *link) logger() *slog.Logger {
	if lg := l.log.Load(); lg != nil {
		return lg
	}
	return slog.Default()
}

// close closes the link's client.
func (l *link) close() error {
	links.Delete(l)
	return l.rdb.Close()
}

// fields are an entry's fields for a message: its headers (but none of the
// adapter's own names), id, key and body, then the bookkeeping fields
// mark holds; a nil body (a parked entry that had none) is left out.
func (l *link) fields(h map[string]string, id, key string, body []byte, mark map[string]string) []any {
	var out []any
	for _, k := range slices.Sorted(maps.Keys(h)) {
		if k != l.c.bodyField && k != KeyField && k != l.c.idField && !slices.Contains(deadletter.Bookkeeping, k) {
			out = append(out, k, h[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(mark)) {
		out = append(out, k, mark[k])
	}
	if id != "" {
		out = append(out, l.c.idField, id)
	}
	if key != "" {
		out = append(out, KeyField, key)
	}
	if body == nil {
		return out
	}
	return append(out, l.c.bodyField, body)
}

// xadd adds values to stream through p, trimming it as WithMaxLen or
// WithMaxAge say.
func (l *link) xadd(ctx context.Context, p goredis.Cmdable, stream string, values []any) *goredis.StringCmd {
	a := &goredis.XAddArgs{Stream: stream, Values: values, Approx: true, MaxLen: l.c.maxLen}
	if l.c.maxAge > 0 {
		a.MinID = strconv.FormatInt(time.Now().Add(-l.c.maxAge).UnixMilli(), 10)
	}
	return p.XAdd(ctx, a)
}

// message reads an entry: the id, key and body fields, and the others as
// headers. Body is nil when the entry has no body field, never when it has
// an empty one.
func (l *link) message(values map[string]any) driver.Message {
	m := driver.Message{Headers: make(map[string]string, len(values))}
	for k, v := range values {
		s, _ := v.(string)
		switch k { // the three fields differ (resolve)
		case l.c.idField:
			m.ID = s
		case KeyField:
			m.Key = s
		case l.c.bodyField:
			m.Body = append([]byte{}, s...)
		default:
			m.Headers[k] = s
		}
	}
	return m
}
