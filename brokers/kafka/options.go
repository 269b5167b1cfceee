package kafka

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/option"
	"github.com/idemq/idemq/internal/redact"
)

// Ordering says which messages of one partition may be in flight together.
type Ordering int

const (
	// OrderPerKey hands out a message only when no earlier message of its
	// Kafka key is in flight or waiting for a retry; other keys (and keyless
	// messages) go concurrently. Default.
	OrderPerKey Ordering = iota + 1
	// OrderPerPartition hands out one message of a partition at a time, in
	// offset order: a retried message holds up its partition.
	OrderPerPartition
	// OrderNone hands out messages in any order; the committed offset still
	// never passes an undecided message.
	OrderNone
)

// String names the ordering as the URL parameter ordering= does.
func (o Ordering) String() string {
	if o >= OrderPerKey && o <= OrderNone {
		return [...]string{"per-key", "per-partition", "none"}[o-OrderPerKey]
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// Option configures a Source or DeadLetters. Options apply in order, after
// the URL's parameters; an invalid one fails the constructor, named.
type Option interface{ apply(*config) error }

// PublisherOption is an Option a Publisher takes as well (a consumer
// option given to NewPublisher does not compile).
type PublisherOption interface {
	Option
	publisher()
}

// srcOpt is an Option of a Source only, pubOpt one of a Publisher too.
type (
	srcOpt func(*config) error
	pubOpt func(*config) error
)

func (o srcOpt) apply(c *config) error { return o(c) }
func (o pubOpt) apply(c *config) error { return o(c) }
func (pubOpt) publisher()              {}

type config struct {
	brokers     []string
	balancers   []kafkago.GroupBalancer
	dialer      *kafkago.Dialer
	tls         *tls.Config
	sasl        sasl.Mechanism
	logger      *slog.Logger // nil: slog.Default(), or what SetLogger gives
	ordering    Ordering
	startOffset int64
	fromURL     bool // errors name the URL's parameters

	topic, group, idHeader, deadLetterTopic, deadLetterGroup, retryTopic string
	commitCount, partitionBuffer                                         int
	commitInterval, revokeTimeout, joinBackoff, fetchMaxWait             time.Duration
	sessionTimeout, heartbeatInterval, rebalanceTimeout, batchTimeout    time.Duration
}

func defaultConfig() config {
	return config{idHeader: DefaultIDHeader, ordering: OrderPerKey, commitInterval: time.Second, commitCount: 1000,
		revokeTimeout: 10 * time.Second, sessionTimeout: 6 * time.Second, heartbeatInterval: 2 * time.Second,
		rebalanceTimeout: 30 * time.Second, joinBackoff: time.Second, startOffset: kafkago.FirstOffset,
		partitionBuffer: 1000, fetchMaxWait: 500 * time.Millisecond, batchTimeout: 2 * time.Millisecond}
}

// newConfig reads addr, applies the URL's options and then opts, and
// settles the dialer's TLS and SASL.
func newConfig[O Option](addr string, opts []O) (config, error) {
	cfg := defaultConfig()
	all, err := parseTarget(addr, &cfg)
	for _, o := range opts {
		all = append(all, o)
	}
	for _, o := range all {
		if err == nil && o != nil {
			err = o.apply(&cfg)
		}
	}
	if err = cmp.Or(err, cfg.validate()); err != nil {
		return cfg, err
	}
	if cfg.tls != nil || cfg.sasl != nil {
		// A copy: the caller's dialer (or kafka-go's default) stays as it is.
		d := kafkago.Dialer{Timeout: 10 * time.Second, DualStack: true}
		if cfg.dialer != nil {
			d = *cfg.dialer
		}
		d.TLS = cmp.Or(cfg.tls, d.TLS)
		if cfg.sasl != nil {
			d.SASLMechanism = cfg.sasl
		}
		cfg.dialer = &d
	}
	return cfg, nil
}

// validate checks the settings WithCommit and WithGroupTimeouts set (the
// URL one by one).
func (c *config) validate() error {
	switch {
	case c.commitInterval < time.Millisecond || c.commitInterval > time.Hour:
		return optErr("WithCommit", "interval %v is outside 1ms..1h0m0s", c.commitInterval)
	case c.commitCount < 1:
		return optErr("WithCommit", "count %d must be at least 1", c.commitCount)
	case c.heartbeatInterval <= 0 || c.sessionTimeout <= c.heartbeatInterval:
		return optErr("WithGroupTimeouts", "need 0 < heartbeat (%v) < session (%v)", c.heartbeatInterval, c.sessionTimeout)
	case c.rebalanceTimeout <= 0:
		return optErr("WithGroupTimeouts", "rebalance timeout %v must be positive", c.rebalanceTimeout)
	}
	return nil
}

// name is the URL parameter of option when the configuration came from a
// URL, else option, for errors about a setting.
func (c *config) name(option string) string {
	if p, ok := urlParams.NameOf(option); ok && c.fromURL {
		return p
	}
	return option
}

// explain adds what to check to broker errors that do not say it: a broker
// refusing SASL credentials may just close the connection.
func (c *config) explain(err error) error {
	switch {
	case errors.Is(err, kafkago.SASLAuthenticationFailed), errors.Is(err, kafkago.UnsupportedSASLMechanism), errors.Is(err, kafkago.IllegalSASLState):
		return fmt.Errorf("%w (check the SASL mechanism, user name and password)", err)
	case c.dialer != nil && c.dialer.SASLMechanism != nil && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)):
		return fmt.Errorf("%w (the broker closed the connection; with SASL that is how it refuses a wrong mechanism, user name or password)", err)
	}
	return err
}

func optErr(name, format string, args ...any) error {
	return option.Errorf("kafka", name, format, args...)
}

// set stores v in *dst unless bad, named in the option's error.
func set[T any](name string, v T, bad error, dst func(*config) *T) func(*config) error {
	return option.Set("kafka", name, bad, func(c *config) { *dst(c) = v })
}

// DefaultIDHeader is the header the business id is read from (and written
// to by the Publisher) unless WithIDHeader says otherwise.
const DefaultIDHeader = "message-id"

// WithTopic sets the topic to consume, required for a Source (for a
// Publisher, the topic of Publish given ""). Default: the URL's path.
func WithTopic(topic string) PublisherOption {
	return pubOpt(set("WithTopic", topic, checkTopic(topic), func(c *config) *string { return &c.topic }))
}

// WithGroup sets the consumer group id, required for a Source. It is
// unrelated to the idemq consumer name (core.WithName).
func WithGroup(group string) Option {
	return srcOpt(set("WithGroup", group, checkGroup(group), func(c *config) *string { return &c.group }))
}

// WithIDHeader names the Kafka header that holds the business id. Default
// "message-id"; CloudEvents' Kafka binding uses "ce_id".
func WithIDHeader(name string) PublisherOption {
	return pubOpt(set("WithIDHeader", name, option.Refuse(name == "", "empty header name"), func(c *config) *string { return &c.idHeader }))
}

// WithOrdering sets which messages of a partition may be in flight
// together. Default OrderPerKey.
func WithOrdering(o Ordering) Option {
	return srcOpt(set("WithOrdering", o, option.Refuse(o < OrderPerKey || o > OrderNone, "unknown ordering %d", int(o)), func(c *config) *Ordering { return &c.ordering }))
}

// WithCommit commits the decided prefixes every interval (1ms..1h), sooner
// once count messages were decided, and on revocation and Close. Default
// 1s and 1000: round trips against redelivered duplicates after a crash.
func WithCommit(interval time.Duration, count int) Option {
	return srcOpt(func(c *config) error { c.commitInterval, c.commitCount = interval, count; return nil })
}

// WithRevokeTimeout bounds how long deliveries may take to settle when a
// rebalance revokes their partitions (later ones are stale). Default 10s,
// below the rebalance timeout.
func WithRevokeTimeout(d time.Duration) Option {
	return srcOpt(set("WithRevokeTimeout", d, option.AtLeast(d, 0), func(c *config) *time.Duration { return &c.revokeTimeout }))
}

// WithGroupTimeouts sets the group's session timeout (bounded by the
// broker), heartbeat interval (below it) and rebalance timeout. Default
// 6s, 2s, 30s: a member killed without leaving holds its partitions, and
// stalls every join, until its session times out.
func WithGroupTimeouts(session, heartbeat, rebalance time.Duration) Option {
	return srcOpt(func(c *config) error {
		c.sessionTimeout, c.heartbeatInterval, c.rebalanceTimeout = session, heartbeat, rebalance
		return nil
	})
}

// WithJoinBackoff sets how long the group waits before joining again after
// a failed join. Default 1s.
func WithJoinBackoff(d time.Duration) Option {
	return srcOpt(set("WithJoinBackoff", d, option.AtLeast(d, time.Nanosecond), func(c *config) *time.Duration { return &c.joinBackoff }))
}

// WithStartOffset sets where a partition without a committed offset
// starts: kafka-go's FirstOffset (default) or LastOffset.
func WithStartOffset(offset int64) Option {
	bad := option.Refuse(offset != kafkago.FirstOffset && offset != kafkago.LastOffset, "%d is neither FirstOffset (-2) nor LastOffset (-1)", offset)
	return srcOpt(set("WithStartOffset", offset, bad, func(c *config) *int64 { return &c.startOffset }))
}

// WithDeadLetterTopic names the topic dead letters go to, with core/driver's
// bookkeeping headers (idemq-origin: topic/partition/offset) and
// HeaderGroup. Default "<topic>.dlq".
func WithDeadLetterTopic(topic string) Option {
	return srcOpt(set("WithDeadLetterTopic", topic, checkTopic(topic), func(c *config) *string { return &c.deadLetterTopic }))
}

// WithDeadLetterGroup names the group in which DeadLetters records what it
// redrove or purged. Default "<group>.dlq-operator".
func WithDeadLetterGroup(group string) Option {
	return srcOpt(set("WithDeadLetterGroup", group, checkGroup(group), func(c *config) *string { return &c.deadLetterGroup }))
}

// WithRetryTopic makes Retry produce a copy to topic (with the attempt and
// a not-before time) and mark the original done, instead of retrying in
// place; the Source consumes topic too. A failing message then holds up
// neither its partition nor its key. Default: retry in place.
func WithRetryTopic(topic string) Option {
	return srcOpt(set("WithRetryTopic", topic, checkTopic(topic), func(c *config) *string { return &c.retryTopic }))
}

// WithPartitionBuffer bounds the messages of a partition held between fetch
// and commit. Default 1000.
func WithPartitionBuffer(n int) Option {
	return srcOpt(set("WithPartitionBuffer", n, option.Range(n, 1, 1_000_000), func(c *config) *int { return &c.partitionBuffer }))
}

// WithDialer sets the kafka-go dialer for every connection; WithTLS and
// WithSASL override its TLS and SASL. Default kafka-go's DefaultDialer.
func WithDialer(d *kafkago.Dialer) PublisherOption {
	return pubOpt(set("WithDialer", d, option.Present(d), func(c *config) **kafkago.Dialer { return &c.dialer }))
}

// WithTLS makes every connection use TLS with cfg. Default: plaintext.
func WithTLS(cfg *tls.Config) PublisherOption {
	return pubOpt(set("WithTLS", cfg, option.Present(cfg), func(c *config) **tls.Config { return &c.tls }))
}

// WithSASL authenticates every connection with m (PLAIN over TLS only).
// Default: no authentication.
func WithSASL(m sasl.Mechanism) PublisherOption {
	return pubOpt(set("WithSASL", m, option.Present(m), func(c *config) *sasl.Mechanism { return &c.sasl }))
}

// WithGroupBalancers sets the partition assignment strategies offered to
// the group, in order of preference. Default: range, then round robin.
func WithGroupBalancers(bs ...kafkago.GroupBalancer) Option {
	err := option.Refuse(len(bs) == 0, "no balancer given")
	if i := slices.Index(bs, nil); i >= 0 {
		err = fmt.Errorf("balancer %d is nil", i)
	}
	return srcOpt(set("WithGroupBalancers", bs, err, func(c *config) *[]kafkago.GroupBalancer { return &c.balancers }))
}

// WithLogger sets the logger for rebalances, commit failures and fetch
// trouble, over the Consumer's (SetLogger). Default: slog.Default().
func WithLogger(l *slog.Logger) PublisherOption {
	return pubOpt(set("WithLogger", l, option.Present(l), func(c *config) **slog.Logger { return &c.logger }))
}

// WithBatchTimeout sets how long the writers wait to fill a batch. Default
// 2ms; kafka-go's own 1s would delay every small synchronous write.
func WithBatchTimeout(d time.Duration) PublisherOption {
	return pubOpt(set("WithBatchTimeout", d, option.Range(d, time.Nanosecond, time.Minute), func(c *config) *time.Duration { return &c.batchTimeout }))
}

// checkGroup applies Kafka's bound on a group id's length.
func checkGroup(g string) error {
	return option.Refuse(g == "" || len(g) > 255, "group id must be 1..255 bytes, got %d", len(g))
}

// checkTopic applies Kafka's topic name rules.
func checkTopic(t string) error {
	switch {
	case t == "":
		return errors.New("empty topic name")
	case len(t) > 249:
		return fmt.Errorf("topic name of %d bytes is longer than 249", len(t))
	case t == "." || t == "..":
		return fmt.Errorf("topic name %q is not allowed", t)
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("topic name holds %q; only [a-zA-Z0-9._-] are allowed", r)
		}
	}
	return nil
}

// urlParams are the parameters of kafka:// URLs: one URL serves the
// Source, the Publisher and DeadLetters.
var urlParams = urlparam.Table[Option]{Scheme: "kafka", Params: map[string]urlparam.Param[Option]{
	"group":              urlparam.Text("WithGroup", WithGroup),
	"id_header":          urlparam.Text("WithIDHeader", func(v string) Option { return WithIDHeader(v) }),
	"ordering":           urlparam.Choice("WithOrdering", map[string]Option{"per-key": WithOrdering(OrderPerKey), "per-partition": WithOrdering(OrderPerPartition), "none": WithOrdering(OrderNone)}),
	"dead_letter_topic":  urlparam.Text("WithDeadLetterTopic", WithDeadLetterTopic),
	"dead_letter_group":  urlparam.Text("WithDeadLetterGroup", WithDeadLetterGroup),
	"retry_topic":        urlparam.Text("WithRetryTopic", WithRetryTopic),
	"start":              urlparam.Choice("WithStartOffset", map[string]Option{"first": WithStartOffset(kafkago.FirstOffset), "last": WithStartOffset(kafkago.LastOffset)}),
	"revoke_timeout":     urlparam.Duration("WithRevokeTimeout", WithRevokeTimeout),
	"commit_interval":    urlparam.Duration("WithCommit", field(func(c *config) *time.Duration { return &c.commitInterval })),
	"commit_count":       urlparam.Int("WithCommit", field(func(c *config) *int { return &c.commitCount })),
	"session_timeout":    urlparam.Duration("WithGroupTimeouts", field(func(c *config) *time.Duration { return &c.sessionTimeout })),
	"heartbeat_interval": urlparam.Duration("WithGroupTimeouts", field(func(c *config) *time.Duration { return &c.heartbeatInterval })),
	"rebalance_timeout":  urlparam.Duration("WithGroupTimeouts", field(func(c *config) *time.Duration { return &c.rebalanceTimeout })),
	// Read together by security.
	"tls":       urlparam.Bool("WithTLS", func(bool) Option { return nil }),
	"ca_file":   urlparam.Text("", none),
	"cert_file": urlparam.Text("", none),
	"key_file":  urlparam.Text("", none),
	"sasl":      urlparam.Text("WithSASL", none),
}}

func none(string) Option { return nil }

// field sets one setting of several that validate checks together.
func field[T any](dst func(*config) *T) func(T) Option {
	return func(v T) Option { return srcOpt(func(c *config) error { *dst(c) = v; return nil }) }
}

// init registers the kafka:// scheme (see the package documentation).
func init() {
	driver.RegisterBroker("kafka", func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
		return Open(ctx, u.String(), loggerOption(cfg))
	}, openPublisherURL)
	admin.RegisterDeadLetters("kafka", func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (admin.DeadLetterQueue, error) {
		return OpenDeadLetters(ctx, u.String(), loggerOption(cfg))
	})
}

func openPublisherURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Publisher, error) {
	p, err := NewPublisher(ctx, u.String(), loggerOption(cfg))
	if err != nil {
		return nil, err
	}
	if p.cfg.topic == "" {
		p.Close()
		return nil, errors.New("kafka URL: no topic to publish to (kafka://host:port/topic)")
	}
	return p, nil
}

// loggerOption is WithLogger of the service's adapter logger, nil (no
// option) when it gave none.
func loggerOption(cfg driver.OpenConfig) PublisherOption {
	if cfg.Logger == nil {
		return nil
	}
	return WithLogger(cfg.Logger)
}

// parseTarget reads a kafka:// URL or a plain comma-separated broker list
// (see Open): the brokers go into c, and the URL's topic, parameters and
// user info come back as options.
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
			return nil, fmt.Errorf("kafka URL: %w", err)
		}
		if u.Scheme != "kafka" {
			return nil, fmt.Errorf("kafka URL: scheme %q, want kafka://", u.Scheme)
		}
		c.fromURL, hosts = true, u.Host
		if topic := strings.Trim(u.Path, "/"); topic != "" {
			if err := checkTopic(topic); err != nil {
				return nil, fmt.Errorf("kafka URL: topic: %w", err)
			}
			opts = append(opts, WithTopic(topic))
		}
		q, err := redact.ParseQuery(u.RawQuery) // u.Query() would drop a pair with a ';' silently
		if err != nil {
			return nil, fmt.Errorf("kafka URL parameters: %w", err)
		}
		for k, vs := range q {
			if len(vs) != 1 {
				return nil, fmt.Errorf("kafka URL parameter %s: given %d times", redact.Name(k), len(vs))
			}
		}
		read, err := urlParams.Read(q)
		if err != nil {
			return nil, err
		}
		sec, err := security(q, u.User)
		if err != nil {
			return nil, err
		}
		read = slices.DeleteFunc(read, func(o Option) bool { return o == nil }) // read by security
		opts = append(append(opts, read...), sec...)
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
			// A broker list may hold pieces of a mistyped URL: mask secrets.
			return nil, fmt.Errorf("kafka: brokers: %q: %w", redact.URL(h), err)
		}
		c.brokers = append(c.brokers, h)
	}
	if len(c.brokers) == 0 {
		return nil, errors.New("kafka: brokers: no host:port in the URL or broker list")
	}
	return opts, nil
}

// security builds WithTLS and WithSASL from the URL's tls, ca_file,
// cert_file, key_file and sasl parameters and its user info.
func security(q url.Values, user *url.Userinfo) ([]Option, error) {
	var opts []Option
	caFile, certFile, keyFile := q.Get("ca_file"), q.Get("cert_file"), q.Get("key_file")
	if on, _ := strconv.ParseBool(q.Get("tls")); !on {
		for _, p := range []string{"ca_file", "cert_file", "key_file"} {
			if q.Get(p) != "" {
				return nil, fmt.Errorf("kafka URL parameter %s: needs tls=true", p)
			}
		}
	} else {
		// ca_file ("" for the system's roots) verifies the brokers;
		// cert_file and key_file (both or neither) are the client's.
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if caFile != "" {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				return nil, fmt.Errorf("kafka URL parameter ca_file: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("kafka URL parameter ca_file: %s holds no PEM certificate", caFile)
			}
		}
		if (certFile == "") != (keyFile == "") {
			return nil, errors.New("kafka URL parameters cert_file and key_file: give both or neither")
		}
		if certFile != "" {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("kafka URL parameters cert_file, key_file: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, WithTLS(tc))
	}
	mechanism := strings.ToLower(q.Get("sasl"))
	if mechanism == "" {
		if user != nil {
			// Not used, so not silently ignored either.
			return nil, errors.New("kafka URL: a user name or password is only read with the sasl parameter (sasl=plain, scram-sha-256 or scram-sha-512)")
		}
		return opts, nil
	}
	name := user.Username() // nil-safe, as is Password
	pass, hasPass := user.Password()
	if name == "" || !hasPass {
		return nil, errors.New("kafka URL parameter sasl: needs a user name and password in the URL (kafka://user:password@host:port/topic)")
	}
	var m sasl.Mechanism
	var err error
	switch mechanism {
	case "plain":
		m = plain.Mechanism{Username: name, Password: pass}
	case "scram-sha-256":
		m, err = scram.Mechanism(scram.SHA256, name, pass)
	case "scram-sha-512":
		m, err = scram.Mechanism(scram.SHA512, name, pass)
	default:
		return nil, errors.New("kafka URL parameter sasl: not plain, scram-sha-256 or scram-sha-512")
	}
	if err != nil { // about the names (SASLprep), never the secret's value
		return nil, errors.New("kafka URL parameter sasl: the user name or password is not valid for SCRAM (SASLprep)")
	}
	return append(opts, WithSASL(m)), nil
}
