package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/core/driver/urlparam"
)

// The headers the adapter reads and writes.
const (
	// DefaultIDHeader holds the business id unless WithIDHeader names
	// another header: JetStream's own publish-side deduplication id.
	DefaultIDHeader = natsgo.MsgIdHdr
	// IDHeader, when present, holds the business id and takes precedence
	// over the id header: Redrive puts the id there, because JetStream
	// drops a publish whose Nats-Msg-Id it saw within the duplicate window.
	IDHeader = "idemq-id"
	// KeyHeader carries Message.Key.
	KeyHeader = "idemq-key"
)

// Option configures a Source or DeadLetters. Options apply in order, after
// the address's URL parameters, which they override; an invalid value
// makes the constructor fail naming the option (or the URL parameter).
type Option interface{ apply(*config) error }

// PublisherOption configures a Publisher, and a Source or DeadLetters
// alike: WithConn, WithNATSOptions, WithSubject, WithDeclare, WithIDHeader.
type PublisherOption interface {
	Option
	publisher()
}

// opt is every option; the constructors' result types tell which
// constructors take it.
type opt func(*config) error

func (o opt) apply(c *config) error { return o(c) }
func (opt) publisher()              {}

type config struct {
	stream, consumer, subject       string
	idHeader, dlqStream, dlqSubject string
	conn                            *natsgo.Conn
	servers                         []string
	natsOpts                        []natsgo.Option
	declare, heartbeat              bool
	ackWait, maxExtension           time.Duration
	replicas                        int
	logger                          *slog.Logger // nil: the Consumer's, or slog.Default()
}

// set returns the option named name: applied, it fails naming the option
// when err is not nil, and otherwise calls f.
func set(name string, err error, f func(*config)) opt { return option.Set("nats", name, err, f) }

func name(v string) error {
	return option.Refuse(v == "" || strings.ContainsAny(v, " \t\r\n.*>"), "%q is not a JetStream name (non-empty, no spaces, '.', '*' or '>')", v)
}

func subject(v string) error {
	bad := v == "" || strings.ContainsAny(v, " \t\r\n") || strings.HasPrefix(v, ".") || strings.HasSuffix(v, ".") || strings.Contains(v, "..")
	return option.Refuse(bad, "%q is not a NATS subject", v)
}

// WithConn uses an open connection instead of dialling the address's
// servers; Close leaves it open, and connection options are ignored.
func WithConn(nc *natsgo.Conn) PublisherOption {
	return set("WithConn", option.NotNil(nc != nil, "connection"), func(c *config) { c.conn = nc })
}

// WithNATSOptions adds nats.go connection options (authentication, TLS,
// reconnect policy, …) to the dialled connection. Default: nats.go's
// defaults plus endless reconnects.
func WithNATSOptions(opts ...natsgo.Option) PublisherOption {
	return set("WithNATSOptions", nil, func(c *config) { c.natsOpts = append(c.natsOpts, opts...) })
}

// WithConsumer names the durable pull consumer the Source consumes with
// and whose dead letters DeadLetters reads. Required for both.
func WithConsumer(v string) Option {
	return set("WithConsumer", name(v), func(c *config) { c.consumer = v })
}

// WithSubject sets the subject: the Source's consumer filter (wildcards
// allowed), where a Publisher publishes when the destination is "", and
// the subject of a stream the adapter declares. Default the stream's name.
func WithSubject(v string) PublisherOption {
	return set("WithSubject", subject(v), func(c *config) { c.subject = v })
}

// WithDeclare chooses whether a missing stream (file storage, the subject
// only) and dead-letter stream are created, and the consumer created or
// updated. Default true; with false, opening fails naming what is missing.
func WithDeclare(b bool) PublisherOption {
	return set("WithDeclare", nil, func(c *config) { c.declare = b })
}

// WithReplicas sets the replicas of the streams the adapter creates (the
// stream and the dead-letter stream; consumers take their stream's): 3
// or 5 on a JetStream cluster, so that a server's loss loses nothing.
// Default 1. Streams that exist keep theirs.
func WithReplicas(n int) PublisherOption {
	return set("WithReplicas", option.Range(n, 1, 5), func(c *config) { c.replicas = n })
}

// WithIDHeader names the header the business id is read from (and that a
// Publisher sets beside Nats-Msg-Id). Default Nats-Msg-Id. The idemq-id
// header, when present, takes precedence.
func WithIDHeader(h string) PublisherOption {
	err := option.Refuse(h == "" || strings.ContainsAny(h, " :\r\n"), "%q is not a header name", h)
	return set("WithIDHeader", err, func(c *config) { c.idHeader = h })
}

// WithAckWait sets the declared consumer's AckWait, the lease the Consumer
// extends: it bounds only how long a crashed instance's deliveries wait.
// Default 6s. A consumer that is not declared keeps its own.
func WithAckWait(d time.Duration) Option {
	return set("WithAckWait", option.AtLeast(d, 100*time.Millisecond), func(c *config) { c.ackWait = d })
}

// WithHeartbeat chooses whether the Consumer keeps the messages it holds
// leased (InProgress every third of the AckWait). Default true; with
// false, JetStream redelivers a message held past the AckWait.
func WithHeartbeat(b bool) Option {
	return set("WithHeartbeat", nil, func(c *config) { c.heartbeat = b })
}

// WithMaxExtension caps how long after its receipt the Consumer keeps a
// message leased; after that JetStream redelivers it. Default 1h.
func WithMaxExtension(d time.Duration) Option {
	return set("WithMaxExtension", option.Positive(d), func(c *config) { c.maxExtension = d })
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
	err := cmp.Or(subject(v), option.Refuse(strings.ContainsAny(v, "*>"), "%q has a wildcard", v))
	return set("WithDeadLetterSubject", err, func(c *config) { c.dlqSubject = v })
}

// WithLogger sets the Source's logger (reconnects, receive errors).
// Default the Consumer's logger (driver.Setup).
func WithLogger(l *slog.Logger) Option {
	return set("WithLogger", option.NotNil(l != nil, "logger"), func(c *config) { c.logger = l })
}

// urlParams are the parameters of nats:// URLs. Every side checks every
// parameter, so one URL serves the Source, the Publisher and DeadLetters.
var urlParams = urlparam.Table[Option]{Scheme: "nats", Params: map[string]urlparam.Param[Option]{
	"consumer":      urlparam.Text("WithConsumer", WithConsumer),
	"subject":       urlparam.Text("WithSubject", func(v string) Option { return WithSubject(v) }),
	"declare":       urlparam.Bool("WithDeclare", func(b bool) Option { return WithDeclare(b) }),
	"id_header":     urlparam.Text("WithIDHeader", func(v string) Option { return WithIDHeader(v) }),
	"ack_wait":      urlparam.Duration("WithAckWait", WithAckWait),
	"heartbeat":     urlparam.Bool("WithHeartbeat", WithHeartbeat),
	"max_extension": urlparam.Duration("WithMaxExtension", WithMaxExtension),
	"replicas":      urlparam.Int("WithReplicas", func(n int) Option { return WithReplicas(n) }),
	"dlq_stream":    urlparam.Text("WithDeadLetterStream", WithDeadLetterStream),
	"dlq_subject":   urlparam.Text("WithDeadLetterSubject", WithDeadLetterSubject),
	"token":         urlparam.Text("", func(v string) Option { return WithNATSOptions(natsgo.Token(v)) }),
	"tls": urlparam.Bool("", func(b bool) Option {
		if b {
			return WithNATSOptions(natsgo.Secure())
		}
		return nil
	}),
	"tls_ca":   file(func(f string) (natsgo.Option, error) { return natsgo.RootCAs(f), nil }),
	"tls_cert": file(nil), // read with tls_key
	"tls_key":  file(nil),
	"nkey_seed": file(func(f string) (natsgo.Option, error) {
		o, err := natsgo.NkeyOptionFromSeed(f)
		if err != nil {
			return nil, errors.New("cannot read an nkey seed from the file")
		}
		return o, nil
	}),
	"creds": file(func(f string) (natsgo.Option, error) { return natsgo.UserCredentials(f), nil }),
}}

func init() {
	// The registry returns nil, not a typed nil, after an error.
	driver.RegisterSource("nats", func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
		return Open(ctx, u.String(), driver.LoggerOption(cfg, WithLogger))
	})
	driver.RegisterPublisher("nats", func(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.Publisher, error) {
		return NewPublisher(ctx, u.String())
	})
	driver.RegisterDeadLetters("nats", func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.DeadLetters, error) {
		return OpenDeadLetters(ctx, u.String(), driver.LoggerOption(cfg, WithLogger))
	})
}

// file is a parameter naming a file that build turns into a connection
// option (nil build: read together with another parameter).
func file(build func(file string) (natsgo.Option, error)) urlparam.Param[Option] {
	return urlparam.Param[Option]{Read: func(v string) ([]Option, error) {
		if v == "" || build == nil {
			return nil, option.Refuse(v == "", "no file named")
		}
		o, err := build(v)
		return []Option{WithNATSOptions(o)}, err
	}}
}

// resolve reads addr (see the package doc), applies opts after its
// parameters and fills the defaults that depend on the stream.
func resolve[O Option](addr string, needConsumer bool, opts []O) (c config, err error) {
	c = config{declare: true, idHeader: DefaultIDHeader, ackWait: 6 * time.Second, heartbeat: true, maxExtension: time.Hour}
	u, err := urlparam.ParseURL(addr)
	if err != nil {
		return c, fmt.Errorf("nats: %w", err)
	}
	c.stream = strings.Trim(u.Path, "/")
	query, qerr := urlparam.ParseQuery(u.RawQuery)
	switch {
	case u.Scheme != "nats":
		return c, errors.New("nats: the address is a nats:// URL (nats://host:4222/STREAM?consumer=NAME)")
	case c.stream == "" || strings.Contains(c.stream, "/"):
		return c, errors.New("nats URL needs the stream as its path (nats://host:4222/STREAM?consumer=NAME)")
	case name(c.stream) != nil:
		return c, fmt.Errorf("nats: stream: %w", name(c.stream))
	case qerr != nil:
		return c, fmt.Errorf("nats URL parameters: %w", qerr)
	case (query.Get("tls_cert") == "") != (query.Get("tls_key") == ""):
		return c, errors.New("nats URL parameters tls_cert and tls_key go together")
	}
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			return c, errors.New("nats URL has an empty host")
		}
		c.servers = append(c.servers, "nats://"+h)
	}
	if u.User != nil {
		pass, ok := u.User.Password()
		if !ok {
			// NATS reads a lone user name as a token, but a URL's user
			// name shows wherever the URL is logged.
			return c, errors.New("nats URL has a user name without a password; give a token with the token parameter instead")
		}
		c.natsOpts = append(c.natsOpts, natsgo.UserInfo(u.User.Username(), pass))
	}
	fromURL, err := urlParams.Read(query)
	if cert := query.Get("tls_cert"); cert != "" {
		fromURL = append(fromURL, WithNATSOptions(natsgo.ClientCert(cert, query.Get("tls_key"))))
	}
	if err == nil {
		if err = urlParams.Explain(apply(&c, fromURL)); err == nil {
			err = apply(&c, opts)
		}
	}
	if err == nil && needConsumer && c.consumer == "" {
		err = errors.New("nats URL has no consumer (add ?consumer=NAME, or WithConsumer)")
	}
	c.subject, c.dlqStream = cmp.Or(c.subject, c.stream), cmp.Or(c.dlqStream, c.stream+"_DLQ")
	if c.dlqSubject == "" && c.consumer != "" {
		c.dlqSubject = "idemq.dlq." + c.stream + "." + c.consumer
	}
	return c, err
}

// apply applies opts to c in order, skipping nil ones.
func apply[O Option](c *config, opts []O) error {
	for _, o := range opts {
		if any(o) != nil {
			if err := o.apply(c); err != nil {
				return err
			}
		}
	}
	return nil
}
