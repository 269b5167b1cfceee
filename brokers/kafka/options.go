package kafka

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/core/driver/urlparam"
)

// The URL schemes the package registers.
const (
	// Scheme is a consumer group's (Source) and the Publisher's.
	Scheme = "kafka"
	// ShareScheme is a share group's (ShareSource).
	ShareScheme = "kafka+share"
)

// Ordering says which messages of one partition may be in flight together.
type Ordering int

const (
	// OrderPerKey keeps each Kafka key's messages in offset order; other
	// keys (and keyless messages) go concurrently. Under a Consumer that
	// keeps a key's order itself (driver.Setup.KeyOrder: not a leased one)
	// a key's messages go out in offset order without waiting for each
	// other; otherwise a message goes out only when no earlier message of
	// its key is in flight or waiting for a retry. Default.
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

// Start says where a group begins reading a partition it has no position
// on yet.
type Start int

const (
	// StartFirst reads each partition from its earliest retained record.
	// Default.
	StartFirst Start = iota + 1
	// StartLast reads only records produced after the group first reads
	// the partition; a consumer group commits that position at once, so a
	// restart before the first record skips nothing.
	StartLast
	// StartAsIs leaves a share group's share.auto.offset.reset as the
	// operator set it (Kafka's default: latest). Share groups only.
	StartAsIs
)

// GroupProtocol is how a consumer group assigns partitions to its members.
type GroupProtocol int

const (
	// ProtocolClassic has the members assign partitions among themselves
	// (JoinGroup and SyncGroup) with the balancers of WithBalancers,
	// cooperative-sticky by default: a rebalance moves only the
	// partitions that change owner. Default; every Kafka has it.
	ProtocolClassic GroupProtocol = iota + 1
	// ProtocolConsumer is KIP-848's: the broker assigns partitions and
	// each member takes and gives up its own through heartbeats, with no
	// group-wide barrier. Kafka 4.0 or later (4.3 or later recommended: an
	// earlier broker may refuse a commit racing an assignment change with
	// STALE_MEMBER_EPOCH); a member falls back to the classic protocol on
	// a broker without it.
	ProtocolConsumer
)

// Option configures a Source, a ShareSource or DeadLetters. Options apply
// in order, after the URL's parameters; an invalid one fails the
// constructor, named.
type Option interface{ apply(*config) error }

// PublisherOption is an Option a Publisher takes as well (a consumer
// option given to NewPublisher does not compile).
type PublisherOption interface {
	Option
	publisher()
}

// srcOpt is an Option of a source only, pubOpt one of a Publisher too.
type (
	srcOpt func(*config) error
	pubOpt func(*config) error
)

func (o srcOpt) apply(c *config) error { return o(c) }
func (o pubOpt) apply(c *config) error { return o(c) }
func (pubOpt) publisher()              {}

type config struct {
	scheme     string
	brokers    []string
	balancers  []kgo.GroupBalancer
	tls        *tls.Config
	sasl       sasl.Mechanism
	clientOpts []kgo.Opt
	logger     *slog.Logger // nil: the Consumer's (Setup.Logger), else slog.Default()
	ordering   Ordering
	start      Start
	protocol   GroupProtocol
	offsetID   bool
	fromURL    bool // errors name the URL's parameters

	topic, group, idHeader, deadLetterTopic, deadLetterGroup, retryTopic, instanceID string
	commitCount, partitionBuffer                                                     int // partitionBuffer 0: the default
	commitInterval, revokeTimeout, maxExtension, linger                              time.Duration
	sessionTimeout, heartbeatInterval, rebalanceTimeout                              time.Duration
}

func defaultConfig() config {
	return config{scheme: Scheme, idHeader: DefaultIDHeader, ordering: OrderPerKey, start: StartFirst, protocol: ProtocolClassic,
		commitInterval: time.Second, commitCount: 1000, revokeTimeout: 10 * time.Second, sessionTimeout: 6 * time.Second,
		heartbeatInterval: 2 * time.Second, rebalanceTimeout: 30 * time.Second, maxExtension: time.Hour}
}

// newConfig reads addr (a URL of one of schemes, or a broker list) and
// applies the URL's options, then opts.
func newConfig[O Option](addr string, opts []O, schemes ...string) (config, error) {
	cfg := defaultConfig()
	all, err := parseTarget(addr, &cfg, schemes)
	for _, o := range opts {
		all = append(all, o)
	}
	for _, o := range all {
		if err == nil && o != nil {
			err = o.apply(&cfg)
		}
	}
	return cfg, cmp.Or(err, cfg.validate())
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
	if p, ok := tableOf(c.scheme).NameOf(option); ok && c.fromURL {
		return p
	}
	return option
}

// explain adds what to check to broker errors that do not say it: a broker
// refusing SASL credentials may just close the connection.
func (c *config) explain(err error) error {
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		return fmt.Errorf("%w (check the SASL mechanism, user name and password)", err)
	case c.sasl != nil && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)):
		return fmt.Errorf("%w (the broker closed the connection; with SASL that is how it refuses a wrong mechanism, user name or password)", err)
	}
	return err
}

// probe asks each seed broker of cl for metadata, once and without
// retrying, until one answers, and returns their errors (explained)
// otherwise: franz-go retries connection trouble (a refused TLS handshake,
// SASL credentials the broker drops the connection on) until the caller's
// deadline, which is then all its error says.
func (c *config) probe(ctx context.Context, cl *kgo.Client) error {
	var errs []error
	for _, b := range cl.SeedBrokers() {
		_, err := b.Request(ctx, kmsg.NewPtrMetadataRequest())
		if err == nil {
			return nil
		}
		errs = append(errs, c.explain(err))
	}
	return fmt.Errorf("kafka: brokers %v: %w", c.brokers, errors.Join(errs...))
}

// kgoOpts are the client options every client of cfg takes: the brokers,
// TLS, SASL, logging, then WithClientOptions'.
func (c *config) kgoOpts(log func() *slog.Logger) []kgo.Opt {
	opts := []kgo.Opt{kgo.SeedBrokers(c.brokers...), kgo.WithLogger(kgoLogger{log}), kgo.ProducerLinger(c.linger),
		kgo.MetadataMinAge(250 * time.Millisecond)}
	if c.tls != nil {
		opts = append(opts, kgo.DialTLSConfig(c.tls.Clone()))
	}
	if c.sasl != nil {
		opts = append(opts, kgo.SASL(c.sasl))
	}
	return append(opts, c.clientOpts...)
}

// kgoLogger sends franz-go's log lines to a logger: its errors as
// warnings, its warnings as information, the rest at debug level.
type kgoLogger struct{ log func() *slog.Logger }

func (kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, kv ...any) {
	lv := slog.LevelDebug
	switch level {
	case kgo.LogLevelError:
		lv = slog.LevelWarn
	case kgo.LogLevelWarn:
		lv = slog.LevelInfo
	}
	k.log().Log(context.Background(), lv, "franz-go: "+msg, kv...)
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

// WithTopic sets the topic to consume, required for a source (for a
// Publisher, the topic of Publish given ""). Default: the URL's path.
func WithTopic(topic string) PublisherOption {
	return pubOpt(set("WithTopic", topic, checkTopic(topic), func(c *config) *string { return &c.topic }))
}

// WithGroup sets the consumer or share group id, required for a source.
// It is unrelated to the idemq consumer name (core.WithName).
func WithGroup(group string) Option {
	return srcOpt(set("WithGroup", group, checkGroup(group), func(c *config) *string { return &c.group }))
}

// WithIDHeader names the Kafka header that holds the business id. Default
// "message-id"; CloudEvents' Kafka binding uses "ce_id".
func WithIDHeader(name string) PublisherOption {
	return pubOpt(set("WithIDHeader", name, option.Refuse(name == "", "empty header name"), func(c *config) *string { return &c.idHeader }))
}

// WithOffsetID gives a record without the id header the id
// topic/partition/offset, the same on every redelivery of the record: for
// producers that set no id. It does not catch a record a producer sent
// twice (two offsets), and a topic deleted and created again reuses
// offsets, whose records would then be decided Duplicate. Default off:
// such a record is dead-lettered (core.ErrMissingID).
func WithOffsetID() Option { return offsetID(true) }

func offsetID(on bool) Option {
	return srcOpt(set("WithOffsetID", on, nil, func(c *config) *bool { return &c.offsetID }))
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

// WithRevokeTimeout bounds how long messages of partitions a rebalance
// revokes may take to settle before the partitions are given up (later
// settlements are stale). Default 10s, below the rebalance timeout.
func WithRevokeTimeout(d time.Duration) Option {
	return srcOpt(set("WithRevokeTimeout", d, option.AtLeast(d, 0), func(c *config) *time.Duration { return &c.revokeTimeout }))
}

// WithGroupTimeouts sets the group's session timeout (bounded by the
// broker), heartbeat interval (below it) and rebalance timeout. Default
// 6s, 2s, 30s. A member that stops without leaving (a killed process, a
// static member) keeps its partitions until its session times out, or
// until a member with its instance id rejoins. With KIP-848 the broker's
// group.consumer.session.timeout.ms and heartbeat interval apply instead.
func WithGroupTimeouts(session, heartbeat, rebalance time.Duration) Option {
	return srcOpt(func(c *config) error {
		c.sessionTimeout, c.heartbeatInterval, c.rebalanceTimeout = session, heartbeat, rebalance
		return nil
	})
}

// WithStart sets where a group begins reading a partition it has no
// position on. Default StartFirst; StartAsIs is for share groups.
func WithStart(s Start) Option {
	return srcOpt(set("WithStart", s, option.Range(s, StartFirst, StartAsIs), func(c *config) *Start { return &c.start }))
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

// defaultPartitionBuffer is WithPartitionBuffer's default.
const defaultPartitionBuffer = 1000

// WithPartitionBuffer bounds the messages of a partition held between
// fetch and commit: those waiting to be handed out, n a partition on
// average (the source polls no more past it), and those handed out or
// decided behind an undecided one, n a partition (fetching the partition
// pauses past it). Default 1000, and for the second bound at least the
// Consumer's window: several workers settle a partition's messages out of
// order, and a smaller bound would pause fetching while the Consumer has
// room (a pause makes franz-go drop what it fetched for the partition).
func WithPartitionBuffer(n int) Option {
	return srcOpt(set("WithPartitionBuffer", n, option.Range(n, 1, 1_000_000), func(c *config) *int { return &c.partitionBuffer }))
}

// WithInstanceID makes the member static (group.instance.id, KIP-345): it
// leaves no group on Close, and a member that rejoins with the id within
// the session timeout gets its partitions back without moving any other
// member's. Give each replica its own id that survives its restarts (a
// StatefulSet pod's ordinal, or its name): two running members with one id
// fence each other out (FENCED_INSTANCE_ID). Default: a dynamic member.
func WithInstanceID(id string) Option {
	bad := option.Refuse(id == "" || len(id) > 249, "instance id must be 1..249 bytes, got %d", len(id))
	return srcOpt(set("WithInstanceID", id, bad, func(c *config) *string { return &c.instanceID }))
}

// WithGroupProtocol sets the consumer group protocol. Default
// ProtocolClassic.
func WithGroupProtocol(p GroupProtocol) Option {
	bad := option.Refuse(p != ProtocolClassic && p != ProtocolConsumer, "unknown protocol %d", int(p))
	return srcOpt(set("WithGroupProtocol", p, bad, func(c *config) *GroupProtocol { return &c.protocol }))
}

// WithBalancers sets the partition assignment strategies a classic group
// member offers, in order of preference. Default
// kgo.CooperativeStickyBalancer(); KIP-848 needs the first to be a sticky
// or range balancer.
func WithBalancers(bs ...kgo.GroupBalancer) Option {
	err := cmp.Or(option.Refuse(len(bs) == 0, "no balancer given"), option.NoneNil(bs, "balancer"))
	return srcOpt(set("WithBalancers", bs, err, func(c *config) *[]kgo.GroupBalancer { return &c.balancers }))
}

// WithMaxExtension caps how long after its delivery a share group's record
// lock is renewed while its handler runs; past it the lock lapses and the
// broker delivers the record again. Default 1h.
func WithMaxExtension(d time.Duration) Option {
	return srcOpt(set("WithMaxExtension", d, option.Positive(d), func(c *config) *time.Duration { return &c.maxExtension }))
}

// WithTLS makes every connection use TLS with cfg. Default: plaintext.
func WithTLS(cfg *tls.Config) PublisherOption {
	return pubOpt(set("WithTLS", cfg, option.Present(cfg), func(c *config) **tls.Config { return &c.tls }))
}

// WithSASL authenticates every connection with m, a franz-go mechanism
// (pkg/sasl/plain, pkg/sasl/scram, …; PLAIN over TLS only). Default: no
// authentication.
func WithSASL(m sasl.Mechanism) PublisherOption {
	return pubOpt(set("WithSASL", m, option.Present(m), func(c *config) *sasl.Mechanism { return &c.sasl }))
}

// WithClientOptions adds franz-go client options after the adapter's own:
// a dialer (kgo.Dialer), a client id, fetch sizes. Options that change
// how the client consumes (kgo.ConsumerGroup, kgo.ConsumePartitions, …)
// break the source.
func WithClientOptions(opts ...kgo.Opt) PublisherOption {
	return pubOpt(func(c *config) error {
		if err := option.NoneNil(opts, "option"); err != nil {
			return optErr("WithClientOptions", "%v", err)
		}
		c.clientOpts = append(c.clientOpts, opts...)
		return nil
	})
}

// WithLogger sets the logger for rebalances, commit failures and fetch
// trouble, over the Consumer's. Default: the Consumer's logger.
func WithLogger(l *slog.Logger) PublisherOption {
	return pubOpt(set("WithLogger", l, option.Present(l), func(c *config) **slog.Logger { return &c.logger }))
}

// WithBatchTimeout sets how long producers linger to fill a batch
// (kgo.ProducerLinger). Default 0: a record goes at once.
func WithBatchTimeout(d time.Duration) PublisherOption {
	return pubOpt(set("WithBatchTimeout", d, option.Range(d, 0, time.Minute), func(c *config) *time.Duration { return &c.linger }))
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

// params are every URL parameter; urlParams and shareParams take theirs.
var params = map[string]urlparam.Param[Option]{
	"group":              urlparam.Text("WithGroup", WithGroup),
	"id_header":          urlparam.Text("WithIDHeader", func(v string) Option { return WithIDHeader(v) }),
	"offset_id":          urlparam.Bool("WithOffsetID", offsetID),
	"ordering":           urlparam.Choice("WithOrdering", map[string]Option{"per-key": WithOrdering(OrderPerKey), "per-partition": WithOrdering(OrderPerPartition), "none": WithOrdering(OrderNone)}),
	"dead_letter_topic":  urlparam.Text("WithDeadLetterTopic", WithDeadLetterTopic),
	"dead_letter_group":  urlparam.Text("WithDeadLetterGroup", WithDeadLetterGroup),
	"retry_topic":        urlparam.Text("WithRetryTopic", WithRetryTopic),
	"start":              urlparam.Choice("WithStart", map[string]Option{"first": WithStart(StartFirst), "last": WithStart(StartLast)}),
	"revoke_timeout":     urlparam.Duration("WithRevokeTimeout", WithRevokeTimeout),
	"commit_interval":    urlparam.Duration("WithCommit", field(func(c *config) *time.Duration { return &c.commitInterval })),
	"commit_count":       urlparam.Int("WithCommit", field(func(c *config) *int { return &c.commitCount })),
	"session_timeout":    urlparam.Duration("WithGroupTimeouts", field(func(c *config) *time.Duration { return &c.sessionTimeout })),
	"heartbeat_interval": urlparam.Duration("WithGroupTimeouts", field(func(c *config) *time.Duration { return &c.heartbeatInterval })),
	"rebalance_timeout":  urlparam.Duration("WithGroupTimeouts", field(func(c *config) *time.Duration { return &c.rebalanceTimeout })),
	"instance_id":        urlparam.Text("WithInstanceID", WithInstanceID),
	"group_protocol":     urlparam.Choice("WithGroupProtocol", map[string]Option{"classic": WithGroupProtocol(ProtocolClassic), "consumer": WithGroupProtocol(ProtocolConsumer)}),
	"max_extension":      urlparam.Duration("WithMaxExtension", WithMaxExtension),
	// Read together by security.
	"tls":       urlparam.Bool("WithTLS", func(bool) Option { return nil }),
	"ca_file":   urlparam.Text("", none),
	"cert_file": urlparam.Text("", none),
	"key_file":  urlparam.Text("", none),
	"sasl":      urlparam.Text("WithSASL", none),
}

// The parameters of kafka:// URLs (one URL serves the Source, the
// Publisher and DeadLetters) and of kafka+share:// URLs.
var (
	urlParams   = urlparam.Table[Option]{Scheme: Scheme, Params: without(params, "max_extension")}
	shareParams = urlparam.Table[Option]{Scheme: ShareScheme, Params: with(without(params, "ordering", "retry_topic", "revoke_timeout",
		"commit_interval", "commit_count", "session_timeout", "heartbeat_interval", "rebalance_timeout", "instance_id", "group_protocol"),
		"start", urlparam.Choice("WithStart", map[string]Option{"first": WithStart(StartFirst), "last": WithStart(StartLast), "as-is": WithStart(StartAsIs)}))}
)

func without(m map[string]urlparam.Param[Option], names ...string) map[string]urlparam.Param[Option] {
	c := maps.Clone(m)
	for _, n := range names {
		delete(c, n)
	}
	return c
}

func with(m map[string]urlparam.Param[Option], name string, p urlparam.Param[Option]) map[string]urlparam.Param[Option] {
	m[name] = p
	return m
}

func tableOf(scheme string) urlparam.Table[Option] {
	if scheme == ShareScheme {
		return shareParams
	}
	return urlParams
}

func none(string) Option { return nil }

// field sets one setting of several that validate checks together.
func field[T any](dst func(*config) *T) func(T) Option {
	return func(v T) Option { return srcOpt(func(c *config) error { *dst(c) = v; return nil }) }
}

// init registers kafka:// (consumer groups, publishing) and kafka+share://
// (share groups) with core.OpenSource, core.OpenPublisher and
// admin.OpenDeadLetters.
func init() {
	driver.RegisterSource(Scheme, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
		return Open(ctx, u.String(), driver.LoggerOption(cfg, WithLogger))
	})
	driver.RegisterSource(ShareScheme, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
		return OpenShare(ctx, u.String(), driver.LoggerOption(cfg, WithLogger))
	})
	driver.RegisterPublisher(Scheme, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Publisher, error) {
		p, err := NewPublisher(ctx, u.String(), driver.LoggerOption(cfg, WithLogger))
		if err == nil && p.cfg.topic == "" {
			p.Close()
			err = errors.New("kafka URL: no topic to publish to (kafka://host:port/topic)")
		}
		return p, err
	})
	driver.RegisterPublisher(ShareScheme, func(context.Context, *url.URL, driver.OpenConfig) (driver.Publisher, error) {
		return nil, errors.New("kafka+share URL: a share group only consumes; publish to the topic with a kafka:// URL")
	})
	for _, scheme := range []string{Scheme, ShareScheme} {
		driver.RegisterDeadLetters(scheme, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.DeadLetters, error) {
			return OpenDeadLetters(ctx, u.String(), driver.LoggerOption(cfg, WithLogger))
		})
	}
}

// parseTarget reads a URL of one of schemes (default: kafka://) or a plain
// comma-separated broker list: the brokers go into c, and the URL's topic,
// parameters and user info come back as options.
func parseTarget(target string, c *config, schemes []string) ([]Option, error) {
	if len(schemes) == 0 {
		schemes = []string{Scheme}
	}
	c.scheme = schemes[0]
	target = strings.TrimSpace(target)
	if target == "" {
		return nil, errors.New("kafka: brokers: empty URL or broker list")
	}
	hosts := target
	var opts []Option
	if strings.Contains(target, "://") {
		u, err := urlparam.ParseURL(target)
		if err != nil {
			return nil, fmt.Errorf("kafka URL: %w", err)
		}
		if !slices.Contains(schemes, u.Scheme) {
			return nil, fmt.Errorf("kafka URL: scheme %q, want %s://", u.Scheme, strings.Join(schemes, ":// or "))
		}
		c.scheme, c.fromURL, hosts = u.Scheme, true, u.Host
		if topic := strings.Trim(u.Path, "/"); topic != "" {
			if err := checkTopic(topic); err != nil {
				return nil, fmt.Errorf("%s URL: topic: %w", c.scheme, err)
			}
			opts = append(opts, WithTopic(topic))
		}
		q, err := urlparam.ParseQuery(u.RawQuery) // u.Query() would drop a pair with a ';' silently
		if err != nil {
			return nil, fmt.Errorf("%s URL parameters: %w", c.scheme, err)
		}
		t := tableOf(c.scheme)
		if err := t.Once(q); err != nil {
			return nil, err
		}
		read, err := t.Read(q)
		if err != nil {
			return nil, err
		}
		sec, err := security(c.scheme, q, u.User)
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
			return nil, fmt.Errorf("kafka: brokers: %q: %w (want host:port)", urlparam.Redact(h), err)
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
func security(scheme string, q url.Values, user *url.Userinfo) ([]Option, error) {
	var opts []Option
	caFile, certFile, keyFile := q.Get("ca_file"), q.Get("cert_file"), q.Get("key_file")
	if on, _ := strconv.ParseBool(q.Get("tls")); !on {
		for _, p := range []string{"ca_file", "cert_file", "key_file"} {
			if q.Get(p) != "" {
				return nil, fmt.Errorf("%s URL parameter %s: needs tls=true", scheme, p)
			}
		}
	} else {
		tc, err := urlparam.TLSConfig(scheme, "", urlparam.File{Param: "ca_file", Path: caFile},
			urlparam.File{Param: "cert_file", Path: certFile}, urlparam.File{Param: "key_file", Path: keyFile})
		if err != nil {
			return nil, err
		}
		opts = append(opts, WithTLS(tc))
	}
	mechanism := strings.ToLower(q.Get("sasl"))
	if mechanism == "" {
		if user != nil {
			// Not used, so not silently ignored either.
			return nil, fmt.Errorf("%s URL: a user name or password is only read with the sasl parameter (sasl=plain, scram-sha-256 or scram-sha-512)", scheme)
		}
		return opts, nil
	}
	name := user.Username() // nil-safe, as is Password
	pass, hasPass := user.Password()
	if name == "" || !hasPass {
		return nil, fmt.Errorf("%s URL parameter sasl: needs a user name and password in the URL (%s://user:password@host:port/topic)", scheme, scheme)
	}
	auth := scram.Auth{User: name, Pass: pass}
	m := map[string]func() sasl.Mechanism{"plain": plain.Auth{User: name, Pass: pass}.AsMechanism,
		"scram-sha-256": auth.AsSha256Mechanism, "scram-sha-512": auth.AsSha512Mechanism}[mechanism]
	if m == nil {
		return nil, fmt.Errorf("%s URL parameter sasl: not plain, scram-sha-256 or scram-sha-512", scheme)
	}
	return append(opts, WithSASL(m())), nil
}
