package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/unsettled"
)

// errRevoked makes a settlement stale: it sends nothing, and the next owner
// gets the message again. After Close the reason is unsettled.ErrClosed.
var errRevoked = errors.New("kafka: the delivery's partition was revoked by a rebalance")

// Source consumes one topic in a consumer group; it is a driver.Source,
// BatchSettler, WindowSetter, RedeliveryHorizoner and LoggerSetter, safe
// for concurrent use.
type Source struct {
	cfg    config
	logs   unsettled.Logger
	client *kafkago.Client
	bkey   string // the broker list, keying the in-process attempt counter

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	mu          sync.Mutex
	changed     chan struct{} // closed and replaced on every change waiters care about
	watched     bool          // someone took changed since it was last closed
	closed      bool
	window      int // 0: unlimited until SetWindow
	outstanding int // handed out, not settled, all generations
	gen         *generation
	rr          int // round-robin start over the generation's partitions
	group       *kafkago.ConsumerGroup

	errs chan error // group trouble reported to Receive, never blocks
	wg   sync.WaitGroup

	writerOnce sync.Once
	writer     *kafkago.Writer

	generations, commits, commitErrs, stale, skipped atomic.Int64
}

// Stats are counters of a Source's life, for operators and tests.
type Stats struct {
	Generations           int64 // consumer group generations this member took part in (one per rebalance)
	Commits, CommitErrors int64 // offset commits that succeeded, that failed
	StaleSettlements      int64 // settlements refused as stale (wrapping driver.ErrStaleDelivery)
	Skipped               int64 // fetched messages an earlier owner's commit metadata says were decided
}

// Open returns a Source for a consumer group on one topic. addr is a
// kafka:// URL (see the package documentation) or a comma-separated broker
// list, with WithTopic and WithGroup; opts override the URL's parameters.
// Open checks the topic and creates a missing dead-letter or retry topic;
// the group is joined at the first Receive.
func Open(ctx context.Context, addr string, opts ...Option) (*Source, error) {
	cfg, err := sourceConfig(addr, opts)
	if err != nil {
		return nil, err
	}
	s := &Source{cfg: cfg, client: cfg.newClient(), bkey: strings.Join(cfg.brokers, ","), changed: make(chan struct{}), errs: make(chan error, 1)}
	s.logs.Init(cfg.logger)
	if err := s.ensureTopics(ctx); err != nil {
		return nil, err
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// sourceConfig reads and checks a Source's (or DeadLetters') addr and
// options.
func sourceConfig(addr string, opts []Option) (config, error) {
	cfg, err := newConfig(addr, opts)
	switch {
	case err != nil:
	case cfg.topic == "":
		err = errors.New("kafka: topic: none given (WithTopic or the kafka:// URL path)")
	case cfg.group == "":
		err = errors.New("kafka: group: none given (WithGroup or ?group= in the kafka:// URL)")
	case cfg.retryTopic == cfg.topic || cfg.deadLetterTopic == cfg.topic:
		err = errors.New("kafka: WithRetryTopic/WithDeadLetterTopic: must differ from the consumed topic")
	case cfg.revokeTimeout >= cfg.rebalanceTimeout:
		err = optErr("WithRevokeTimeout", "%v must be shorter than the rebalance timeout %v (WithGroupTimeouts)", cfg.revokeTimeout, cfg.rebalanceTimeout)
	}
	cfg.deadLetterTopic = cmp.Or(cfg.deadLetterTopic, cfg.topic+".dlq")
	return cfg, err
}

// ensureTopics checks the consumed topic and creates a missing dead-letter
// or retry topic like it: when the cluster refuses, Open fails naming the
// setting rather than every dead letter (or retry) failing later.
func (s *Source) ensureTopics(ctx context.Context) error {
	want := append(s.topics(), s.cfg.deadLetterTopic)
	md, err := s.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: want})
	if err != nil {
		return fmt.Errorf("kafka: brokers %v: %w", s.cfg.brokers, s.cfg.explain(err))
	}
	found := map[string]kafkago.Topic{}
	for _, t := range md.Topics {
		if t.Error == nil && len(t.Partitions) > 0 {
			found[t.Name] = t
		} else if t.Name == s.cfg.topic && t.Error != nil {
			return fmt.Errorf("kafka: topic %q: %w", t.Name, t.Error)
		}
	}
	src, ok := found[s.cfg.topic]
	if !ok {
		return fmt.Errorf("kafka: topic %q does not exist", s.cfg.topic)
	}
	var create []kafkago.TopicConfig
	for _, name := range want[1:] {
		if _, ok := found[name]; !ok {
			create = append(create, kafkago.TopicConfig{Topic: name, NumPartitions: len(src.Partitions), ReplicationFactor: max(1, len(src.Partitions[0].Replicas))})
		}
	}
	if len(create) == 0 {
		return nil
	}
	resp, err := s.client.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: create})
	for _, tc := range create {
		cerr := err
		if cerr == nil {
			cerr = resp.Errors[tc.Topic]
		}
		if cerr == nil {
			s.log().Info("idemq kafka: created a missing topic", "topic", tc.Topic, "partitions", tc.NumPartitions, "replication_factor", tc.ReplicationFactor)
		} else if !errors.Is(cerr, kafkago.TopicAlreadyExists) {
			setting := s.cfg.name("WithDeadLetterTopic")
			if tc.Topic == s.cfg.retryTopic {
				setting = s.cfg.name("WithRetryTopic")
			}
			return fmt.Errorf("kafka: %s: topic %q does not exist and the cluster refused to create it: %w; create it or name an existing topic", setting, tc.Topic, s.cfg.explain(cerr))
		}
	}
	return nil
}

// log is the logger the Source logs to.
func (s *Source) log() *slog.Logger { return s.logs.Log() }

// SetLogger makes the Source log to l (the Consumer's logger), unless it
// was given one of its own (WithLogger, core.WithAdapterLogger).
func (s *Source) SetLogger(l *slog.Logger) { s.logs.SetLogger(l) }

func (s *Source) topics() []string {
	return slices.DeleteFunc([]string{s.cfg.topic, s.cfg.retryTopic}, func(t string) bool { return t == "" })
}

// Topic returns the consumed topic.
func (s *Source) Topic() string { return s.cfg.topic }

// Group returns the consumer group id.
func (s *Source) Group() string { return s.cfg.group }

// Stats returns the Source's counters.
func (s *Source) Stats() Stats {
	return Stats{s.generations.Load(), s.commits.Load(), s.commitErrs.Load(), s.stale.Load(), s.skipped.Load()}
}

// SetWindow caps the deliveries handed out and not yet settled. Default:
// no cap besides WithPartitionBuffer.
func (s *Source) SetWindow(n int) error {
	if n < 1 {
		return fmt.Errorf("kafka: SetWindow: window %d is below 1", n)
	}
	s.change(func() { s.window = n })
	return nil
}

// HorizonHint implements driver.HorizonHinter: the topic's retention.ms at
// most the store's retention.
func (s *Source) HorizonHint(retention time.Duration) string {
	return fmt.Sprintf("set topic %s's retention.ms to at most %d: kafka-configs.sh --bootstrap-server HOST:PORT --alter --entity-type topics --entity-name %s --add-config retention.ms=%d",
		s.cfg.topic, retention.Milliseconds(), s.cfg.topic, retention.Milliseconds())
}

// RedeliveryHorizon reads the topic's retention.ms: a group whose offsets
// are lost or reset re-reads everything still retained. Infinite retention
// is driver.Unbounded; false: the broker cannot say.
func (s *Source) RedeliveryHorizon(ctx context.Context) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := s.client.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{Resources: []kafkago.DescribeConfigRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: s.cfg.topic, ConfigNames: []string{"retention.ms"}}}})
	if err != nil {
		s.log().Debug("idemq kafka: reading retention.ms", "topic", s.cfg.topic, "error", err)
		return 0, false
	}
	for _, r := range resp.Resources {
		for _, e := range r.ConfigEntries {
			if ms, err := strconv.ParseInt(e.ConfigValue, 10, 64); r.Error == nil && e.ConfigName == "retention.ms" && err == nil {
				if ms < 0 {
					return driver.Unbounded, true
				}
				return time.Duration(ms) * time.Millisecond, true
			}
		}
	}
	return 0, false
}

// Receive returns the next delivery, blocking until one is available, ctx
// is done or the Source is closed (driver.ErrSourceClosed). While the group
// cannot be joined it may return the error; calling it again is safe.
func (s *Source) Receive(ctx context.Context) (driver.Delivery, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, driver.ErrSourceClosed
		}
		if s.group == nil {
			if err := s.start(); err != nil {
				s.mu.Unlock()
				return nil, err
			}
		}
		if s.window == 0 || s.outstanding < s.window {
			if e := s.pick(time.Now()); e != nil {
				d := s.handOut(e)
				s.mu.Unlock()
				return d, nil
			}
		}
		ch := s.watch()
		s.mu.Unlock()
		select {
		case <-ch:
		case err := <-s.errs:
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.ctx.Done():
			return nil, driver.ErrSourceClosed
		}
	}
}

// start creates the consumer group and its generation loop. s.mu is held.
func (s *Source) start() error {
	cg, err := kafkago.NewConsumerGroup(kafkago.ConsumerGroupConfig{
		ID: s.cfg.group, Brokers: s.cfg.brokers, Dialer: s.cfg.dialer, Topics: s.topics(), GroupBalancers: s.cfg.balancers,
		HeartbeatInterval: s.cfg.heartbeatInterval, SessionTimeout: s.cfg.sessionTimeout, RebalanceTimeout: s.cfg.rebalanceTimeout,
		JoinGroupBackoff: s.cfg.joinBackoff, StartOffset: s.cfg.startOffset, ErrorLogger: kafkaLogger(s.log()),
	})
	if err != nil {
		return fmt.Errorf("kafka: consumer group: %w", err)
	}
	s.group = cg
	s.wg.Go(func() { s.run(cg) })
	return nil
}

// joinSlowAfter is how long a join may take before the Source logs what
// it waits for.
const joinSlowAfter = 2 * time.Second

// joinTroubleAfter is how long joins must keep failing before Receive
// reports it: rebalances fail a join or two as a matter of course.
const joinTroubleAfter = 10 * time.Second

// run takes part in one generation after the other until Close.
func (s *Source) run(cg *kafkago.ConsumerGroup) {
	var lastErr string
	var lastLog, failingSince time.Time
	for {
		// A join waits for the members the coordinator still counts, a
		// killed one included until its session times out: say so once.
		slow := time.AfterFunc(joinSlowAfter, func() {
			s.log().Info("idemq kafka: waiting to join the group; a member that stopped without leaving holds its partitions until its session times out",
				"group", s.cfg.group, "session_timeout", s.cfg.sessionTimeout, "setting", "session_timeout= (WithGroupTimeouts)")
		})
		kgen, err := cg.Next(s.ctx)
		slow.Stop()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, kafkago.ErrGroupClosed) {
				return
			}
			// A misconfiguration fails every join: log it once in a while.
			if err.Error() != lastErr || time.Since(lastLog) > 30*time.Second {
				s.log().Warn("idemq kafka: joining the group failed; kafka-go retries", "group", s.cfg.group, "error", err)
				lastErr, lastLog = err.Error(), time.Now()
			}
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if time.Since(failingSince) > joinTroubleAfter {
				select { // to a waiting Receive, never blocking
				case s.errs <- fmt.Errorf("kafka: %w", err):
				default:
				}
			}
			continue
		}
		failingSince = time.Time{}
		s.generations.Add(1)
		g := s.newGeneration(kgen)
		done := make(chan struct{})
		kgen.Start(func(ctx context.Context) {
			defer close(done)
			s.runGeneration(ctx, g)
		})
		// Next returns the following generation only after this one
		// ended; waiting here keeps the hand-over strictly sequential.
		<-done
	}
}

// broadcast wakes everyone waiting on s.changed. s.mu is held. Nobody
// waiting, it costs nothing: it runs for every fetch and settlement.
func (s *Source) broadcast() {
	if s.watched {
		close(s.changed)
		s.changed, s.watched = make(chan struct{}), false
	}
}

// watch returns the channel the next broadcast closes. s.mu is held.
func (s *Source) watch() <-chan struct{} {
	s.watched = true
	return s.changed
}

// Close leaves the group: it stops handing out messages, commits every
// partition's decided prefix, and releases the partitions, without waiting
// for deliveries in flight: settling one afterwards sends nothing and
// returns an error wrapping driver.ErrStaleDelivery.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	cg := s.group
	s.broadcast()
	s.mu.Unlock()
	s.cancel()
	var err error
	if cg != nil {
		err = cg.Close() // ends the generation, which commits on its way out
	}
	s.wg.Wait()
	return cmp.Or(err, closeConns(s.client, s.writer))
}

// AckBatch marks deliveries of this Source done under one lock. The
// returned error joins one error per delivery that failed.
func (s *Source) AckBatch(ctx context.Context, ds []driver.Delivery) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.broadcast() // once for the batch
	own, errs := unsettled.Take("kafka", ds, func(d *delivery) bool { return d.src == s }, func(d *delivery) error { return d.wrap(d.Claim()) })
	for _, d := range own {
		if err := s.settleQuietly(d, nil); err != nil {
			errs = append(errs, d.wrap(err))
		}
	}
	return errors.Join(errs...)
}

// transport builds the kafka-go Transport from the dialer's TLS, SASL,
// client id and DialFunc. Its metadata is refreshed every second: kafka-go
// refreshes it only on that timer, not on NOT_LEADER_FOR_PARTITION, so
// after a leader moved writers retry the former one until the refresh.
func transport(d *kafkago.Dialer) *kafkago.Transport {
	t := &kafkago.Transport{DialTimeout: 10 * time.Second, MetadataTTL: time.Second}
	if d == nil {
		return t
	}
	t.TLS, t.SASL, t.ClientID = d.TLS, d.SASLMechanism, d.ClientID
	if d.Timeout > 0 {
		t.DialTimeout = d.Timeout
	}
	t.Dial = d.DialFunc
	if t.Dial == nil {
		t.Dial = (&net.Dialer{Timeout: t.DialTimeout, KeepAlive: d.KeepAlive}).DialContext
	}
	return t
}

// dlqWriter returns the writer for dead letters and retry copies.
func (s *Source) dlqWriter() *kafkago.Writer {
	s.writerOnce.Do(func() {
		s.writer = s.cfg.newWriter(&kafkago.Murmur2Balancer{}, s.log())
		s.writer.MaxAttempts = 1 // produceThenDone retries, with backoff and a bound
	})
	return s.writer
}

// newClient returns a client of the brokers.
func (c *config) newClient() *kafkago.Client {
	return &kafkago.Client{Addr: kafkago.TCP(c.brokers...), Timeout: 10 * time.Second, Transport: transport(c.dialer)}
}

// newWriter returns a writer that waits for every in-sync replica.
func (c *config) newWriter(b kafkago.Balancer, log *slog.Logger) *kafkago.Writer {
	return &kafkago.Writer{Addr: kafkago.TCP(c.brokers...), Balancer: b, RequiredAcks: kafkago.RequireAll,
		BatchTimeout: c.batchTimeout, Transport: transport(c.dialer), ErrorLogger: kafkaLogger(log)}
}

// closeConns flushes and closes w and the connections of w and c (each
// when not nil).
func closeConns(c *kafkago.Client, w *kafkago.Writer) error {
	var err error
	if w != nil {
		err = w.Close()
		w.Transport.(*kafkago.Transport).CloseIdleConnections()
	}
	if c != nil {
		c.Transport.(*kafkago.Transport).CloseIdleConnections()
	}
	return err
}

// kafkaLogger sends kafka-go's error log, every transient fetch or
// connection error, to l at debug level; the Source reports what matters.
func kafkaLogger(l *slog.Logger) kafkago.Logger {
	return kafkago.LoggerFunc(func(format string, args ...any) { l.Debug("kafka-go: " + fmt.Sprintf(format, args...)) })
}

// appendHeaders appends m to hs as Kafka headers, in key order.
func appendHeaders(hs []kafkago.Header, m map[string]string) []kafkago.Header {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		hs = append(hs, kafkago.Header{Key: k, Value: []byte(m[k])})
	}
	return hs
}
