// Package redis is idemq's Redis Streams broker adapter, built on
// github.com/redis/go-redis/v9, for Redis 7.0 or later.
//
// A Source reads a stream as a member of a consumer group (XREADGROUP,
// explicit acks; Open creates the group with MKSTREAM). An entry holds a
// message in fields: the id in idemq-id (WithIDField, id_field=, names
// another), the key in idemq-key, the body in body, and each header,
// traceparent included, in a field of its own. Attempt is the entry's
// delivery count, Source the stream, System "redis".
//
// Ack is XACK, AckBatch one XACK for the batch, both sent only when the
// Consumer settles. Retry leaves the entry pending: XAUTOCLAIM hands it
// out again once idle for WithMinIdle, with a higher delivery count, so a
// poison message reaches the Consumer's MaxAttempts. A heartbeat keeps
// unsettled entries from being reclaimed (XCLAIM JUSTID every third of
// min_idle) up to WithMaxExtension. DeadLetter adds the entry with
// driver's bookkeeping fields to the dead-letter stream (STREAM:dlq) and
// acknowledges it in one MULTI/EXEC. Entries deleted from the stream while
// pending are acknowledged when XAUTOCLAIM reports them. Close gives the
// unsettled entries back at once.
//
// Importing the package registers redis:// and rediss:// (TLS) with
// core.OpenSource, core.OpenPublisher and admin.OpenDeadLetters:
//
//	redis://[user:pass@]host:6379/STREAM?group=G&consumer=C&…
//
// The parameters are those of docs/brokers.md, each named in errors.
package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/option"
	"github.com/idemq/idemq/internal/redact"
)

// The fields an entry holds a message in, every other field being a
// header: DefaultIDField the business id (unless WithIDField names another
// field), KeyField Message.Key, BodyField Message.Body.
const (
	DefaultIDField = "idemq-id"
	KeyField       = "idemq-key"
	BodyField      = "body"
)

// Option configures a Source, Publisher or DeadLetters. Options apply in
// order; an invalid value makes the constructor fail naming the option (or,
// opened by URL, the parameter).
type Option func(*config) error

type config struct {
	user, pass, group, consumer, start, idField, dlq string
	tls                                              *tls.Config
	minIdle, maxExtension, poll, maxAge              time.Duration
	window                                           int
	maxLen                                           int64
	logger                                           *slog.Logger
}

func set(name string, err error, f func(*config)) Option { return option.Set("redis", name, err, f) }

func named(v string) error {
	if v == "" {
		return errors.New("empty")
	}
	return nil
}

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

// WithMinIdle is the lease: an entry idle this long is reclaimed by the
// group (give every Source the same), and the longest Retry delay. 30s.
func WithMinIdle(d time.Duration) Option {
	return set("WithMinIdle", option.AtLeast(d, 100*time.Millisecond), func(c *config) { c.minIdle = d })
}

// WithMaxExtension caps the heartbeat's hold on an entry. Default 1h.
func WithMaxExtension(d time.Duration) Option {
	return set("WithMaxExtension", option.Positive(d), func(c *config) { c.maxExtension = d })
}

// WithWindow bounds the entries a Source holds unsettled. Default 100.
func WithWindow(n int) Option {
	return set("WithWindow", option.Positive(n), func(c *config) { c.window = n })
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
	for _, scheme := range []string{"redis", "rediss"} {
		driver.RegisterBroker(scheme, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
			var logger Option // nil options are skipped
			if cfg.Logger != nil {
				logger = WithLogger(cfg.Logger)
			}
			return Open(ctx, u.String(), logger)
		}, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Publisher, error) {
			return NewPublisher(ctx, u.String())
		})
		admin.RegisterDeadLetters(scheme, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (admin.DeadLetterQueue, error) {
			return OpenDeadLetters(ctx, u.String())
		})
	}
}

var file = urlparam.NonEmpty("", func(string) Option { return nil })

// params are the URL parameters; every side checks all of them.
var params = urlparam.Table[Option]{Scheme: "redis", Params: map[string]urlparam.Param[Option]{
	"group":         urlparam.NonEmpty("WithGroup", WithGroup),
	"consumer":      urlparam.NonEmpty("WithConsumer", WithConsumer),
	"start":         urlparam.NonEmpty("WithStart", WithStart),
	"id_field":      urlparam.NonEmpty("WithIDField", WithIDField),
	"id_header":     urlparam.NonEmpty("", WithIDField), // the name core's missing-id causes give
	"min_idle":      urlparam.Duration("WithMinIdle", WithMinIdle),
	"max_extension": urlparam.Duration("WithMaxExtension", WithMaxExtension),
	"window":        urlparam.Int("WithWindow", WithWindow),
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
	u, err := redact.ParseURL(raw)
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
	q, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return "", "", nil, fmt.Errorf("redis URL parameters: %w", err)
	}
	read, err := params.Read(q)
	if err == nil && u.Scheme == "rediss" {
		var tc *tls.Config
		tc, err = tlsConfig(u.Hostname(), q.Get("tls_ca"), q.Get("tls_cert"), q.Get("tls_key"))
		opts = append(opts, WithTLS(tc))
	} else if err == nil && q.Get("tls_ca")+q.Get("tls_cert")+q.Get("tls_key") != "" {
		err = errors.New("redis URL parameters tls_ca, tls_cert and tls_key need a rediss:// URL")
	}
	return addr, stream, append(opts, read...), err
}

// tlsConfig verifies the server as host against the system's CAs or those
// in the file ca, and presents cert and key if given.
func tlsConfig(host, ca, cert, key string) (*tls.Config, error) {
	tc := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("redis URL parameter tls_ca: %w", err)
		}
		if tc.RootCAs = x509.NewCertPool(); !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, errors.New("redis URL parameter tls_ca: no PEM certificate in the file")
		}
	}
	if (cert == "") != (key == "") {
		return nil, errors.New("redis URL parameters tls_cert and tls_key go together")
	} else if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("redis URL parameters tls_cert and tls_key: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// link is a client, its config and the stream.
type link struct {
	c      config
	rdb    *goredis.Client
	stream string
}

// resolve applies the URL's options, then opts, for stream over the
// defaults.
func resolve(stream string, needGroup bool, fromURL, opts []Option) (config, error) {
	c := config{start: "0", idField: DefaultIDField, dlq: stream + ":dlq", minIdle: 30 * time.Second, maxExtension: time.Hour, poll: 500 * time.Millisecond, window: 100}
	c.consumer, _ = os.Hostname()
	err := params.Explain(option.Apply(&c, fromURL...))
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
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, Username: c.user, Password: c.pass, TLSConfig: c.tls, ClientName: "idemq"})
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redis: connecting to %s: %w", addr, err)
	}
	return &link{c, rdb, stream}, nil
}

// fields are an entry's fields for a message: its headers (but none of the
// adapter's own names), id, key and body.
func (l *link) fields(h map[string]string, id, key string, body []byte) []any {
	var out []any
	for _, k := range slices.Sorted(maps.Keys(h)) {
		if k != BodyField && k != KeyField && k != l.c.idField && !slices.Contains(deadletter.Bookkeeping, k) {
			out = append(out, k, h[k])
		}
	}
	if id != "" {
		out = append(out, l.c.idField, id)
	}
	if key != "" {
		out = append(out, KeyField, key)
	}
	return append(out, BodyField, body)
}

// fieldList lays h out as XADD's field-value list, in name order.
func fieldList(h map[string]string) []any {
	out := make([]any, 0, 2*len(h))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		out = append(out, k, h[k])
	}
	return out
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
// headers.
func message(idField string, values map[string]any) driver.Message {
	h := make(map[string]string, len(values))
	for k, v := range values {
		h[k], _ = v.(string)
	}
	m := driver.Message{ID: h[idField], Key: h[KeyField], Body: []byte(h[BodyField]), Headers: h}
	delete(h, idField)
	delete(h, KeyField)
	delete(h, BodyField)
	return m
}
