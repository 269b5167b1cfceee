package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/idemq/idemq/internal/option"
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
	deadLetterGroup   string
	retryTopic        string
	partitionBuffer   int
	fetchMaxWait      time.Duration
	dialer            *kafkago.Dialer
	tls               *tls.Config
	sasl              sasl.Mechanism
	balancers         []kafkago.GroupBalancer
	logger            *slog.Logger // nil: slog.Default(), or what SetLogger gives
	batchTimeout      time.Duration
	fromURL           bool // target was a kafka:// URL: errors name its parameters
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
		batchTimeout:      2 * time.Millisecond,
	}
}

// newConfig reads target (see parseTarget), then applies opts and, after
// them, what the URL says, and settles the dialer's TLS and SASL.
func newConfig(target string, opts []Option) (config, error) {
	cfg := defaultConfig()
	urlOpts, err := parseTarget(target, &cfg)
	if err != nil {
		return cfg, err
	}
	if err := option.Apply(&cfg, append(append([]Option{}, opts...), urlOpts...)...); err != nil {
		return cfg, err
	}
	if cfg.tls != nil || cfg.sasl != nil {
		// A copy: the caller's dialer (or kafka-go's default) stays as it is.
		d := kafkago.Dialer{Timeout: 10 * time.Second, DualStack: true}
		if cfg.dialer != nil {
			d = *cfg.dialer
		}
		if cfg.tls != nil {
			d.TLS = cfg.tls
		}
		if cfg.sasl != nil {
			d.SASLMechanism = cfg.sasl
		}
		cfg.dialer = &d
	}
	return cfg, nil
}

// name is the option's name, or the URL parameter's when the target was a
// kafka:// URL, for errors about a setting.
func (c *config) name(option, param string) string {
	if c.fromURL {
		return param
	}
	return option
}

// explain adds what to check to the broker errors whose own text does not
// say it: a broker that refuses SASL credentials may just close the
// connection. It never quotes a credential.
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

// set returns the Option that stores v in the field dst points at once
// check (nil: anything goes) accepts it; a refusal names the option.
func set[T any](name string, v T, check func(T) error, dst func(*config) *T) Option {
	var err error
	if check != nil {
		err = check(v)
	}
	return option.Set("kafka", name, err, func(c *config) { *dst(c) = v })
}

// within accepts values in lo..hi.
func within[T int | time.Duration](lo, hi T) func(T) error {
	return func(v T) error { return option.Range(v, lo, hi) }
}

// atLeast accepts values from lo up.
func atLeast[T int | time.Duration](lo T) func(T) error {
	return func(v T) error { return option.AtLeast(v, lo) }
}

// DefaultIDHeader is the header the business id is read from (and written
// to by the Publisher) unless WithIDHeader says otherwise.
const DefaultIDHeader = "message-id"

// WithTopic sets the topic to consume (or, for a Publisher, the topic
// Publish uses when given ""). Default: the path of a kafka:// URL.
// Required for a Source.
func WithTopic(topic string) Option {
	return set("WithTopic", topic, checkTopic, func(c *config) *string { return &c.topic })
}

// WithGroup sets the consumer group id. Default: the "group" query
// parameter of a kafka:// URL. Required for a Source. It is unrelated to
// the idemq consumer name (core.WithName), though using the same string
// for both is natural.
func WithGroup(group string) Option {
	return set("WithGroup", group, checkGroup, func(c *config) *string { return &c.group })
}

// checkGroup applies Kafka's bound on a group id's length.
func checkGroup(g string) error {
	if g == "" || len(g) > 255 {
		return fmt.Errorf("group id must be 1..255 bytes, got %d", len(g))
	}
	return nil
}

// WithIDHeader names the Kafka header that holds the business id. Default
// "message-id". Producers following CloudEvents' Kafka binding put the
// event id in "ce_id": WithIDHeader("ce_id") reads it from there. For ids
// that need more than one header, use core.WithIDFunc.
func WithIDHeader(name string) Option {
	return set("WithIDHeader", name, func(n string) error {
		if n == "" {
			return errors.New("empty header name")
		}
		return nil
	}, func(c *config) *string { return &c.idHeader })
}

// WithOrdering sets which messages of a partition may be in flight
// together. Default OrderPerKey.
func WithOrdering(o Ordering) Option {
	return set("WithOrdering", o, func(o Ordering) error {
		if o != OrderPerKey && o != OrderPerPartition && o != OrderNone {
			return fmt.Errorf("unknown ordering %d", int(o))
		}
		return nil
	}, func(c *config) *Ordering { return &c.ordering })
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
		if err := within(time.Millisecond, time.Hour)(interval); err != nil {
			return optErr("WithCommit", "interval %v", err)
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
// released. Settling them later returns an error wrapping
// core.ErrStaleDelivery (the new owner gets the message again and decides
// Duplicate if it was committed). Default 10s. It must be shorter than the
// rebalance timeout.
func WithRevokeTimeout(d time.Duration) Option {
	return set("WithRevokeTimeout", d, atLeast(time.Duration(0)), func(c *config) *time.Duration { return &c.revokeTimeout })
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
	return set("WithJoinBackoff", d, atLeast(time.Nanosecond), func(c *config) *time.Duration { return &c.joinBackoff })
}

// WithStartOffset sets where a partition without a committed offset
// starts: kafka-go's FirstOffset (the default: nothing published before
// the group first joined is skipped) or LastOffset.
func WithStartOffset(offset int64) Option {
	return set("WithStartOffset", offset, func(o int64) error {
		if o != kafkago.FirstOffset && o != kafkago.LastOffset {
			return fmt.Errorf("%d is neither FirstOffset (-2) nor LastOffset (-1)", o)
		}
		return nil
	}, func(c *config) *int64 { return &c.startOffset })
}

// WithDeadLetterTopic names the topic DeadLetter produces to. Default
// "<topic>.dlq". Open makes sure it exists: it creates a missing one with
// the consumed topic's partition count and replication factor, and fails
// (naming this option, or the URL's dead_letter_topic) when the cluster
// refuses to create it. See DeadLetter for what happens when it cannot be
// written later.
func WithDeadLetterTopic(topic string) Option {
	return set("WithDeadLetterTopic", topic, checkTopic, func(c *config) *string { return &c.deadLetterTopic })
}

// WithDeadLetterGroup names the consumer group in which a DeadLetters
// records which dead letters it redrove or purged (Kafka cannot delete
// single records). Default "<group>.dlq-operator". Name one when the
// cluster's ACLs allow only certain group ids, or when the default would be
// longer than 255 bytes. The Source ignores it.
func WithDeadLetterGroup(group string) Option {
	return set("WithDeadLetterGroup", group, checkGroup, func(c *config) *string { return &c.deadLetterGroup })
}

// WithRetryTopic makes Retry produce a copy of the message to topic (with
// the attempt and the time it may be processed in headers), wait for the
// write, and mark the original done, instead of retrying in place. The
// Source then also consumes topic in the same group and holds each copy
// until its time. Use it when one failing message must not hold up its
// partition's committed offset. A retried message then no longer holds up
// later messages of its key: per-key order is given up for it. Open
// creates a missing retry topic as it does the dead-letter topic (and
// fails naming this option, or the URL's retry_topic, when the cluster
// refuses). Default: retry in place.
func WithRetryTopic(topic string) Option {
	return set("WithRetryTopic", topic, checkTopic, func(c *config) *string { return &c.retryTopic })
}

// WithPartitionBuffer bounds the messages of one partition held between
// fetch and commit (waiting, in flight, or decided behind an undecided
// one): fetching from a partition pauses at the bound. Default 1000.
func WithPartitionBuffer(n int) Option {
	return set("WithPartitionBuffer", n, within(1, 1_000_000), func(c *config) *int { return &c.partitionBuffer })
}

// WithDialer sets the kafka-go dialer for every connection (TLS, SASL,
// client id, timeouts, a custom DialFunc). Default kafka-go's
// DefaultDialer. The DLQ, retry-topic and Publisher writers use its TLS,
// SASL, client id and DialFunc too. WithTLS and WithSASL, in any order,
// override the dialer's TLS and SASL settings.
func WithDialer(d *kafkago.Dialer) Option {
	return set("WithDialer", d, option.Present, func(c *config) **kafkago.Dialer { return &c.dialer })
}

// WithTLS makes every connection (the group, fetches, commits, the DLQ,
// retry-topic and Publisher writers) use TLS with cfg: its RootCAs verify
// the brokers (nil: the system's roots), its Certificates are the client
// certificate for mutual TLS. An empty ServerName is taken from the broker
// address. The kafka:// URL's tls=true, ca_file, cert_file and key_file
// parameters build one. Default: plaintext.
func WithTLS(cfg *tls.Config) Option {
	return set("WithTLS", cfg, option.Present, func(c *config) **tls.Config { return &c.tls })
}

// WithSASL authenticates every connection with m: kafka-go's
// sasl/plain.Mechanism or a sasl/scram mechanism (SCRAM-SHA-256 or -512).
// The kafka:// URL's sasl=plain|scram-sha-256|scram-sha-512 parameter
// builds one from the URL's user name and password. PLAIN sends the
// password as it is: use it over TLS only. Default: no authentication.
func WithSASL(m sasl.Mechanism) Option {
	return set("WithSASL", m, option.Present, func(c *config) *sasl.Mechanism { return &c.sasl })
}

// WithGroupBalancers sets the partition assignment strategies offered to
// the group, in order of preference (every member must offer the one
// chosen). Default kafka-go's: range, then round robin.
func WithGroupBalancers(bs ...kafkago.GroupBalancer) Option {
	return set("WithGroupBalancers", bs, func(bs []kafkago.GroupBalancer) error {
		if len(bs) == 0 {
			return errors.New("no balancer given")
		}
		for i, b := range bs {
			if b == nil {
				return fmt.Errorf("balancer %d is nil", i)
			}
		}
		return nil
	}, func(c *config) *[]kafkago.GroupBalancer { return &c.balancers })
}

// WithLogger sets the logger for rebalances, commit failures and fetch
// trouble. It wins over the logger a Consumer offers its Source
// (SetLogger) and over core.WithAdapterLogger. Until one of them is
// given, the Source and the Publisher log to slog.Default().
func WithLogger(l *slog.Logger) Option {
	return set("WithLogger", l, option.Present, func(c *config) **slog.Logger { return &c.logger })
}

// WithBatchTimeout sets how long the Publisher's (and the DLQ's) writer
// waits to fill a batch before sending it. Default 2ms; kafka-go's own
// default of 1s would delay every small synchronous write by a second.
func WithBatchTimeout(d time.Duration) Option {
	return set("WithBatchTimeout", d, within(time.Nanosecond, time.Minute), func(c *config) *time.Duration { return &c.batchTimeout })
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
		c.fromURL = true
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
		qopts, err := queryOptions(q, u.User)
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
			// A broker list may hold pieces of a mistyped URL: quote it
			// with anything that looks like a secret masked.
			return nil, fmt.Errorf("kafka: brokers: %q: %w", redact.URL(h), err)
		}
		c.brokers = append(c.brokers, h)
	}
	if len(c.brokers) == 0 {
		return nil, errors.New("kafka: brokers: no host:port in the URL or broker list")
	}
	return opts, nil
}

// queryOptions turns a kafka:// URL's parameters (and its user name and
// password, which only sasl= reads) into options.
func queryOptions(q url.Values, user *url.Userinfo) ([]Option, error) {
	var opts []Option
	interval, count := time.Duration(0), 0
	var session, heartbeat, rebalance *time.Duration
	var sec security
	for k, vs := range q {
		if len(vs) != 1 {
			return nil, fmt.Errorf("kafka: url parameter %s: given %d times", redact.Name(k), len(vs))
		}
		v := vs[0]
		bad := func(want string) error { return fmt.Errorf("kafka: url parameter %s: not %s", k, want) }
		dur := func(dst *time.Duration) error {
			d, err := time.ParseDuration(v)
			if err != nil {
				return bad("a duration")
			}
			*dst = d
			return nil
		}
		var err error
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
		case "dead_letter_group":
			opts = append(opts, WithDeadLetterGroup(v))
		case "retry_topic":
			opts = append(opts, WithRetryTopic(v))
		case "start":
			o, ok := map[string]int64{"first": kafkago.FirstOffset, "last": kafkago.LastOffset}[v]
			if !ok {
				return nil, bad("first or last")
			}
			opts = append(opts, WithStartOffset(o))
		case "commit_interval":
			err = dur(&interval)
		case "commit_count":
			if count, err = strconv.Atoi(v); err != nil {
				err = bad("a number")
			}
		case "revoke_timeout":
			var d time.Duration
			err = dur(&d)
			opts = append(opts, WithRevokeTimeout(d))
		case "session_timeout":
			session = new(time.Duration)
			err = dur(session)
		case "heartbeat_interval":
			heartbeat = new(time.Duration)
			err = dur(heartbeat)
		case "rebalance_timeout":
			rebalance = new(time.Duration)
			err = dur(rebalance)
		case "tls":
			if sec.tls, err = strconv.ParseBool(v); err != nil {
				err = bad("true or false")
			}
		case "ca_file":
			sec.caFile = v
		case "cert_file":
			sec.certFile = v
		case "key_file":
			sec.keyFile = v
		case "sasl":
			sec.mechanism = v
		default:
			return nil, fmt.Errorf("kafka: url parameter %s: unknown", redact.Name(k))
		}
		if err != nil {
			return nil, err
		}
	}
	if session != nil || heartbeat != nil || rebalance != nil {
		opts = append(opts, func(c *config) error {
			s, h, r := c.sessionTimeout, c.heartbeatInterval, c.rebalanceTimeout
			for _, p := range []struct{ from, to *time.Duration }{{session, &s}, {heartbeat, &h}, {rebalance, &r}} {
				if p.from != nil {
					*p.to = *p.from
				}
			}
			return WithGroupTimeouts(s, h, r)(c)
		})
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
	secOpts, err := sec.options(user)
	if err != nil {
		return nil, err
	}
	return append(opts, secOpts...), nil
}

// security is what a kafka:// URL says about TLS and SASL.
type security struct {
	tls                       bool
	caFile, certFile, keyFile string
	mechanism                 string
}

// options builds WithTLS and WithSASL from the URL's parameters and user
// info. Errors name the parameter and never quote the password.
func (s security) options(user *url.Userinfo) ([]Option, error) {
	var opts []Option
	if !s.tls {
		for _, p := range []struct{ name, v string }{{"ca_file", s.caFile}, {"cert_file", s.certFile}, {"key_file", s.keyFile}} {
			if p.v != "" {
				return nil, fmt.Errorf("kafka: url parameter %s: needs tls=true", p.name)
			}
		}
	} else {
		tc, err := tlsConfig(s.caFile, s.certFile, s.keyFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, WithTLS(tc))
	}
	if s.mechanism == "" {
		if user != nil {
			// Not used, so not silently ignored either.
			return nil, errors.New("kafka: url: a user name or password is only read with the sasl parameter (sasl=plain, scram-sha-256 or scram-sha-512)")
		}
		return opts, nil
	}
	name := user.Username() // nil-safe, as is Password
	pass, hasPass := user.Password()
	if name == "" || !hasPass {
		return nil, errors.New("kafka: url parameter sasl: needs a user name and password in the URL (kafka://user:password@host:port/topic)")
	}
	var m sasl.Mechanism
	switch strings.ToLower(s.mechanism) {
	case "plain":
		m = plain.Mechanism{Username: name, Password: pass}
	case "scram-sha-256", "scram-sha-512":
		algo := scram.SHA256
		if strings.HasSuffix(s.mechanism, "512") {
			algo = scram.SHA512
		}
		sm, err := scram.Mechanism(algo, name, pass)
		if err != nil {
			// scram's errors are about the names (SASLprep), not the secret's value.
			return nil, errors.New("kafka: url parameter sasl: the user name or password is not valid for SCRAM (SASLprep)")
		}
		m = sm
	default:
		return nil, errors.New("kafka: url parameter sasl: not plain, scram-sha-256 or scram-sha-512")
	}
	return append(opts, WithSASL(m)), nil
}

// tlsConfig builds the TLS configuration of tls=true: caFile ("" for the
// system's roots) verifies the brokers, certFile and keyFile (both or
// neither) are the client certificate.
func tlsConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("kafka: url parameter ca_file: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka: url parameter ca_file: %s holds no PEM certificate", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("kafka: url parameters cert_file and key_file: give both or neither")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("kafka: url parameters cert_file, key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
