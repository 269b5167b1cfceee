package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/attempts"
	"github.com/idemq/idemq/core/driver/retry"
)

// Reasons of a stale settlement, wrapped by driver.Stale: nothing is sent,
// and the partition's next owner (this Source again, or another) gets the
// message.
var (
	errRevoked = errors.New("kafka: the message's partition was revoked by a rebalance")
	errClosed  = errors.New("kafka: the source was closed")
)

// Source consumes one topic (and its retry topic, WithRetryTopic) as a
// member of a consumer group: a driver.Puller, Releaser,
// RedeliveryHorizoner and HorizonHinter, safe for concurrent use. Kafka's
// acknowledgement is an offset commit that covers every earlier offset of
// a partition, so the Source commits per partition only the contiguous
// prefix of decided messages, and records in the commit's metadata which
// offsets above it are decided (the next owner skips those).
type Source struct {
	base
	adm *kadm.Client

	member *kgo.Client // joined at Start
	stop   context.CancelFunc
	loops  sync.WaitGroup
	kick   chan struct{} // commit now
	errs   chan error    // trouble for a waiting Receive, never blocks

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every change a waiter cares about
	watched  bool          // someone took changed since it was last closed
	started  bool
	closed   bool
	early    bool              // Setup.KeyOrder taken up: a key's next messages go out before the earlier are settled
	ahead    int               // messages a partition waiting to be handed out, on average, past which polling stops
	held     int               // messages a partition handed out or decided behind an undecided one, past which it pauses
	parts    map[tp]*partition // owned, revoking ones included
	ring     []*partition      // owned and not revoking, in hand-out rotation
	rr       int
	decided  int // since the last commit
	commitMu sync.Mutex

	assigned, revoked, commits, commitErrs, stale, skipped atomic.Int64
}

// Stats are counters of a Source's life, for operators and tests.
type Stats struct {
	Assigned, Revoked     int64 // partitions assigned to this member; revoked from it or lost
	Commits, CommitErrors int64 // offset commits that succeeded, that failed
	StaleSettlements      int64 // settlements refused as stale (wrapping driver.ErrStaleDelivery)
	Skipped               int64 // fetched messages an earlier owner's commit metadata says were decided
}

var (
	_ driver.Puller              = (*Source)(nil)
	_ driver.Releaser            = (*Source)(nil)
	_ driver.RedeliveryHorizoner = (*Source)(nil)
	_ driver.HorizonHinter       = (*Source)(nil)
)

// tp names a partition.
type tp struct {
	topic string
	id    int32
}

// pollRecords is the most records one poll takes from the member.
const pollRecords = 1000

// Open returns a Source for a consumer group on one topic. addr is a
// kafka:// URL (see the package documentation) or a comma-separated broker
// list, with WithTopic and WithGroup; opts override the URL's parameters.
// Open checks the topic and creates a missing dead-letter or retry topic;
// the group is joined at Start.
func Open(ctx context.Context, addr string, opts ...Option) (*Source, error) {
	s := &Source{changed: make(chan struct{}), kick: make(chan struct{}, 1), errs: make(chan error, 1), parts: map[tp]*partition{}}
	if err := s.open(ctx, addr, opts, Scheme); err != nil {
		return nil, err
	}
	s.adm = kadm.NewClient(s.cl)
	if err := s.ensureTopics(ctx); err != nil {
		s.cl.Close()
		return nil, err
	}
	return s, nil
}

// base is what both sources keep: the settings, a client for topics,
// configs and copies (the group member is apart), and the logger.
type base struct {
	cfg    config
	cl     *kgo.Client
	logger atomic.Pointer[slog.Logger]
}

// open reads addr and opts for scheme, and connects the client.
func (b *base) open(ctx context.Context, addr string, opts []Option, scheme string) error {
	cfg, err := sourceConfig(addr, opts, scheme)
	if err != nil {
		return err
	}
	b.cfg = cfg
	b.logger.Store(cmp.Or(cfg.logger, slog.Default()))
	if b.cl, err = kgo.NewClient(cfg.kgoOpts(b.log)...); err != nil {
		return fmt.Errorf("%s: %w", scheme, err)
	}
	if err := cfg.probe(ctx, b.cl); err != nil {
		b.cl.Close()
		return err
	}
	return nil
}

// log is the logger the source logs to.
func (b *base) log() *slog.Logger { return b.logger.Load() }

// adopt takes the Consumer's logger unless WithLogger gave one.
func (b *base) adopt(st driver.Setup) {
	if b.cfg.logger == nil && st.Logger != nil {
		b.logger.Store(st.Logger)
	}
}

// sourceConfig reads and checks a source's (or DeadLetters') addr and
// options.
func sourceConfig(addr string, opts []Option, schemes ...string) (config, error) {
	cfg, err := newConfig(addr, opts, schemes...)
	switch {
	case err != nil:
	case cfg.topic == "":
		err = errors.New("kafka: topic: none given (WithTopic or the URL path)")
	case cfg.group == "":
		err = errors.New("kafka: group: none given (WithGroup or ?group= in the URL)")
	case cfg.retryTopic == cfg.topic || cfg.deadLetterTopic == cfg.topic:
		err = fmt.Errorf("kafka: %s/%s: must differ from the consumed topic", cfg.name("WithRetryTopic"), cfg.name("WithDeadLetterTopic"))
	case cfg.scheme == Scheme && cfg.revokeTimeout >= cfg.rebalanceTimeout:
		err = optErr(cfg.name("WithRevokeTimeout"), "%v must be shorter than the rebalance timeout %v (WithGroupTimeouts)", cfg.revokeTimeout, cfg.rebalanceTimeout)
	case cfg.scheme == Scheme && cfg.start == StartAsIs:
		err = optErr("WithStart", "StartAsIs is for share groups")
	}
	cfg.deadLetterTopic = cmp.Or(cfg.deadLetterTopic, cfg.topic+".dlq")
	return cfg, err
}

// ensureTopics checks the consumed topic and creates a missing dead-letter
// or retry topic like it: when the cluster refuses, Open fails naming the
// setting rather than every dead letter (or retry) failing later.
func (s *Source) ensureTopics(ctx context.Context) error {
	want := append(s.topics(), s.cfg.deadLetterTopic)
	td, err := s.adm.ListTopics(ctx, want...)
	if err != nil {
		return fmt.Errorf("kafka: brokers %v: %w", s.cfg.brokers, s.cfg.explain(err))
	}
	src, ok := td[s.cfg.topic]
	if !ok || errors.Is(src.Err, kerr.UnknownTopicOrPartition) {
		return fmt.Errorf("kafka: topic %q does not exist", s.cfg.topic)
	} else if src.Err != nil {
		return fmt.Errorf("kafka: topic %q: %w", s.cfg.topic, s.cfg.explain(src.Err))
	}
	rf := 1
	for _, p := range src.Partitions {
		rf = max(rf, len(p.Replicas))
	}
	for _, name := range want[1:] {
		if d, ok := td[name]; ok && d.Err == nil {
			continue
		}
		_, err := s.adm.CreateTopic(ctx, int32(len(src.Partitions)), int16(rf), nil, name)
		if err == nil || errors.Is(err, kerr.TopicAlreadyExists) {
			s.log().Info("idemq kafka: created a missing topic", "topic", name, "partitions", len(src.Partitions), "replication_factor", rf)
			continue
		}
		setting := s.cfg.name("WithDeadLetterTopic")
		if name == s.cfg.retryTopic {
			setting = s.cfg.name("WithRetryTopic")
		}
		return fmt.Errorf("kafka: %s: topic %q does not exist and the cluster refused to create it: %w; create it or name an existing topic", setting, name, s.cfg.explain(err))
	}
	return nil
}

func (s *Source) topics() []string {
	if s.cfg.retryTopic == "" {
		return []string{s.cfg.topic}
	}
	return []string{s.cfg.topic, s.cfg.retryTopic}
}

// Topic returns the consumed topic.
func (s *Source) Topic() string { return s.cfg.topic }

// Group returns the consumer group id.
func (s *Source) Group() string { return s.cfg.group }

// Stats returns the Source's counters.
func (s *Source) Stats() Stats {
	return Stats{s.assigned.Load(), s.revoked.Load(), s.commits.Load(), s.commitErrs.Load(), s.stale.Load(), s.skipped.Load()}
}

// HorizonHint implements driver.HorizonHinter: the topic's retention.ms at
// most the store's retention.
func (s *Source) HorizonHint(retention time.Duration) string {
	return fmt.Sprintf("set topic %s's retention.ms to at most %d: kafka-configs.sh --bootstrap-server HOST:PORT --alter --entity-type topics --entity-name %s --add-config retention.ms=%d",
		s.cfg.topic, retention.Milliseconds(), s.cfg.topic, retention.Milliseconds())
}

// RedeliveryHorizon implements driver.RedeliveryHorizoner with the topic's
// retention.ms: a group whose offsets are lost or reset re-reads
// everything still retained. Infinite retention is driver.Unbounded.
func (s *Source) RedeliveryHorizon(ctx context.Context) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rcs, err := s.adm.DescribeTopicConfigs(ctx, s.cfg.topic)
	if err != nil {
		s.log().Debug("idemq kafka: reading retention.ms", "topic", s.cfg.topic, "error", err)
		return 0, false
	}
	for _, rc := range rcs {
		for _, c := range rc.Configs {
			if ms, err := strconv.ParseInt(c.MaybeValue(), 10, 64); rc.Err == nil && c.Key == "retention.ms" && err == nil {
				if ms < 0 {
					return driver.Unbounded, true
				}
				return time.Duration(ms) * time.Millisecond, true
			}
		}
	}
	return 0, false
}

// Start implements driver.Source: it joins the group. Retries are kept in
// place while the Consumer waits out their delay, unless a retry topic
// keeps them or the Consumer keeps each key's order (Setup.KeyOrder): then
// they wait in place, in their lane (Traits.DelaysRetry).
func (s *Source) Start(ctx context.Context, st driver.Setup) (driver.Traits, error) {
	s.adopt(st)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closed {
		return driver.Traits{}, errors.New("kafka: Start: the source was started or closed before")
	}
	s.started = true
	// Under a Consumer that keeps each key's order itself, a key's next
	// messages go out before the earlier are settled: a poll's messages
	// are decided in batches, in offset order, as a hand-written loop
	// decides them. A retry topic takes a retried message out of its
	// lane, so nothing would end the Consumer's hold on its key.
	s.early = st.KeyOrder && s.cfg.ordering == OrderPerKey && s.cfg.retryTopic == ""
	s.ahead, s.held = s.cfg.partitionBuffer, s.cfg.partitionBuffer
	if s.cfg.partitionBuffer == 0 {
		s.ahead, s.held = defaultPartitionBuffer, max(defaultPartitionBuffer, st.Window)
	}
	reset := kgo.NewOffset().AtStart()
	if s.cfg.start == StartLast {
		reset = kgo.NewOffset().AtEnd()
	}
	opts := append(s.cfg.kgoOpts(s.log), kgo.ConsumerGroup(s.cfg.group), kgo.ConsumeTopics(s.topics()...),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.ConsumeStartOffset(reset), kgo.ConsumeResetOffset(reset),
		kgo.FetchMaxWait(500*time.Millisecond), kgo.SessionTimeout(s.cfg.sessionTimeout),
		kgo.HeartbeatInterval(s.cfg.heartbeatInterval), kgo.RebalanceTimeout(s.cfg.rebalanceTimeout),
		kgo.OnPartitionsAssigned(s.onAssigned), kgo.OnPartitionsRevoked(s.onRevoked), kgo.OnPartitionsLost(s.onLost),
		kgo.AdjustFetchOffsetsFn(s.adjust))
	if len(s.cfg.balancers) > 0 {
		opts = append(opts, kgo.Balancers(s.cfg.balancers...))
	}
	if s.cfg.instanceID != "" {
		opts = append(opts, kgo.InstanceID(s.cfg.instanceID))
	}
	if s.cfg.protocol == ProtocolConsumer {
		opts = append(opts, kgo.ServerSideBalancer())
	}
	member, err := kgo.NewClient(opts...)
	if err != nil {
		return driver.Traits{}, fmt.Errorf("kafka: consumer group: %w", err)
	}
	lctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.member, s.stop = member, stop
	s.loops.Go(func() { s.poll(lctx) })
	s.loops.Go(func() { s.commitLoop(lctx) })
	return driver.Traits{DelaysRetry: s.cfg.retryTopic != "" || s.early, KeyOrder: s.early}, nil
}

// Receive implements driver.Puller: it returns up to max messages the
// ordering lets go, visiting the partitions in turn, and blocks while
// there are none.
func (s *Source) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	for {
		s.mu.Lock()
		if s.closed || !s.started {
			s.mu.Unlock()
			return nil, driver.ErrSourceClosed
		}
		full := s.fullLocked()
		if ms := s.pickLocked(time.Now(), max); len(ms) > 0 {
			if full && !s.fullLocked() {
				s.broadcast() // the poll loop waits for room
			}
			s.mu.Unlock()
			return ms, nil
		}
		ch := s.watch()
		s.mu.Unlock()
		select {
		case <-ch:
		case err := <-s.errs:
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// pickLocked hands out up to limit waiting messages, one partition after
// the other. s.mu is held.
func (s *Source) pickLocked(now time.Time, limit int) []*driver.Message {
	var out []*driver.Message
	for n, progress := len(s.ring), true; progress && len(out) < limit && n > 0; s.rr = (s.rr + 1) % n {
		progress = false
		for i := 0; i < n && len(out) < limit; i++ {
			p := s.ring[(s.rr+i)%n]
			e := p.pick(now)
			if e == nil {
				continue
			}
			e.state, p.dirty, progress = handed, true, true
			p.out++
			p.throttle()
			p.high = max(p.high, e.r.Offset)
			e.handouts++
			e.attempt = e.baseTry + e.handouts
			if e.handouts == 1 && e.r.Offset <= p.prevHigh {
				e.attempt++ // handed out before, by this or another process
			}
			if out == nil {
				out = make([]*driver.Message, 0, min(limit, pollRecords))
			}
			out = append(out, s.message(e, now))
		}
	}
	return out
}

// Ack implements driver.Source: the messages are done; their offsets are
// committed once every earlier message of their partition is decided too.
func (s *Source) Ack(_ context.Context, ms []*driver.Message) error {
	return s.settle(ms, false, time.Time{}, false)
}

// Release implements driver.Releaser: the messages wait again in their
// place, to be handed out next as the ordering allows, without counting
// the hand-out as an attempt.
func (s *Source) Release(_ context.Context, ms []*driver.Message) error {
	return s.settle(ms, true, time.Time{}, true)
}

// Retry implements driver.Source. In place (the default), the message is
// handed out again once delay passed, and the committed offset waits for
// it (later messages of its key or partition wait behind it, as the
// ordering says). With WithRetryTopic it produces a copy to the retry
// topic, processed no sooner than delay, and marks the original done.
func (s *Source) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	if s.cfg.retryTopic == "" {
		return s.settle(ms, true, time.Now().Add(max(delay, 0)), false)
	}
	// Rounded up: the copy must never be processed before its delay.
	notBefore := strconv.FormatInt((time.Now().Add(delay).UnixNano()+999_999)/1_000_000, 10)
	return s.copyThenDone(ctx, ms, s.cfg.retryTopic, func(i int, e *entry) (map[string]string, time.Time) {
		return map[string]string{driver.AttemptHeader: strconv.Itoa(ms[i].Attempt + 1), HeaderNotBefore: notBefore, driver.OriginHeader: e.origin()}, time.Time{}
	})
}

// DeadLetter implements driver.Source: a copy of each message goes to the
// dead-letter topic with the bookkeeping headers (deadletter.Mark) and
// HeaderGroup, acknowledged by every in-sync replica, then the original is
// marked done. A message whose copy failed stays undecided and is handed
// out again after a second.
func (s *Source) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	return s.copyThenDone(ctx, ms, s.cfg.deadLetterTopic, func(i int, e *entry) (map[string]string, time.Time) {
		return deadLetterHeaders(causes[i], ms[i].Attempt, e.origin(), s.cfg.group)
	})
}

// settle marks ms done (requeue false) or waiting again until notBefore;
// a released message's hand-out is not counted as an attempt.
func (s *Source) settle(ms []*driver.Message, requeue bool, notBefore time.Time, release bool) error {
	var errs []error
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.broadcast() // once for the batch
	for i, m := range ms {
		e, err := s.entryOf(m)
		if err == nil && requeue && !release && e.state == handed && !e.p.dead {
			e.p.recall(e) // in the same hold of s.mu as the requeue: nothing of its key goes out between
		}
		if err == nil {
			err = s.settleLocked(e, requeue, notBefore)
		}
		if err == nil && release {
			e.handouts--
		}
		if err != nil {
			if errs == nil {
				errs = make([]error, len(ms))
			}
			errs[i] = err
		}
	}
	return driver.PartialOf(errs)
}

// entryOf returns the entry m was handed out from, when this Source did.
func (s *Source) entryOf(m *driver.Message) (*entry, error) {
	if e, ok := m.AckID.(*entry); ok && e.p.src == s {
		return e, nil
	}
	return nil, fmt.Errorf("kafka: message %q was not received from this source", m.ID)
}

// staleLocked returns the error of a settlement of e that must send
// nothing: its partition was given up, or the Source closed. s.mu is held.
func (s *Source) staleLocked(e *entry) error {
	var err error
	switch {
	case e.p.dead:
		err = driver.Stale(errRevoked)
	case s.closed:
		err = driver.Stale(errClosed)
	default:
		return nil
	}
	s.stale.Add(1)
	return e.wrap(err)
}

// settleLocked ends e's hand-out: done (requeue false), or waiting again
// until notBefore. s.mu is held.
func (s *Source) settleLocked(e *entry, requeue bool, notBefore time.Time) error {
	if err := s.staleLocked(e); err != nil {
		return err
	}
	if e.state != handed {
		return e.wrap(errors.New("not handed out"))
	}
	p := e.p
	p.out--
	if requeue {
		e.state, e.notBefore = waiting, notBefore
		p.settled(e, true)
		p.throttle()
		if d := time.Until(notBefore); d > 0 {
			s.wakeAt(d)
		}
		return nil
	}
	e.state, p.dirty = done, true
	p.decided++
	p.settled(e, false)
	p.advance()
	if s.decided++; s.decided >= s.cfg.commitCount {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// Close implements driver.Source: it leaves the group (a static member
// keeps its membership until its session times out), committing every
// partition's decided prefix first. A settlement afterwards sends nothing
// and returns an error wrapping driver.ErrStaleDelivery.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.broadcast()
	member := s.member
	s.mu.Unlock()
	if member != nil {
		s.stop()
		s.loops.Wait()
		s.commit(nil)
		member.AllowRebalance()
		member.Close() // revokes every partition: onRevoked commits what changed since
	}
	s.cl.Close()
	return nil
}

// poll moves what the member fetches into the partitions until ctx ends.
// Rebalances wait while a poll's records are put in place
// (kgo.BlockRebalanceOnPoll), so that no record of a revoked partition
// lands in the partition's next assignment.
func (s *Source) poll(ctx context.Context) {
	pace := retry.New(50*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		// Poll only while fewer than WithPartitionBuffer messages a
		// partition wait to be handed out: franz-go fetches no more for a
		// broker until its last fetch was polled, so this bounds what is
		// buffered without pausing partitions (see throttle).
		s.mu.Lock()
		for s.fullLocked() && ctx.Err() == nil {
			ch := s.watch()
			s.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
			}
			s.mu.Lock()
		}
		s.mu.Unlock()
		fs := s.member.PollRecords(ctx, pollRecords)
		// Each record is read into its entry's Message now, while it is
		// in the cache and outside the lock; the entries share one array.
		es, i := make([]entry, fs.NumRecords()), 0
		fs.EachRecord(func(r *kgo.Record) {
			es[i].r = r
			readRecord(r, &s.cfg, &es[i].first)
			i++
		})
		now := time.Now()
		s.mu.Lock()
		for i := range es {
			s.addLocked(&es[i], now)
		}
		s.broadcast()
		s.mu.Unlock()
		s.member.AllowRebalance()
		var trouble error
		fs.EachError(func(topic string, id int32, err error) {
			if ctx.Err() == nil && trouble == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
				trouble = s.trouble(topic, id, err)
			}
		})
		if trouble == nil {
			pace.Reset()
			continue
		}
		s.log().Warn("idemq kafka: fetching failed; franz-go retries", "group", s.cfg.group, "error", trouble)
		select {
		case s.errs <- trouble:
		default:
		}
		pace.Wait(ctx)
	}
}

// fullLocked reports whether WithPartitionBuffer messages a partition
// wait to be handed out, past which the source polls no more. s.mu is
// held.
func (s *Source) fullLocked() bool {
	return s.waitingLocked() >= s.ahead*max(len(s.parts), 1)
}

// waitingLocked counts the messages fetched and not handed out. s.mu is
// held.
func (s *Source) waitingLocked() int {
	n := 0
	for _, p := range s.parts {
		n += p.waiting
	}
	return n
}

// trouble words a fetch or group error for the operator.
func (s *Source) trouble(topic string, id int32, err error) error {
	if errors.Is(err, kerr.FencedInstanceID) {
		return fmt.Errorf("kafka: group %s: another member joined with instance id %q and fenced this one out (FENCED_INSTANCE_ID); give each replica an id of its own, such as its StatefulSet ordinal: %w", s.cfg.group, s.cfg.instanceID, err)
	}
	if topic == "" {
		return fmt.Errorf("kafka: group %s: %w", s.cfg.group, s.cfg.explain(err))
	}
	return fmt.Errorf("kafka: group %s, %s[%d]: %w", s.cfg.group, topic, id, s.cfg.explain(err))
}

// addLocked puts a fetched record in its partition. s.mu is held.
func (s *Source) addLocked(e *entry, now time.Time) {
	r := e.r
	p := s.parts[tp{r.Topic, r.Partition}]
	if p == nil || p.dead {
		return
	}
	e.p = p
	if p.retry {
		e.notBefore, e.baseTry = retryHeaders(r.Headers)
	}
	if carried.n.Load() > 0 {
		k := p.offsetKey(r.Offset)
		if n := carried.m.Last(k); n > 0 {
			e.handouts = n
			carried.m.Forget(k)
		}
	}
	p.next = r.Offset + 1
	p.entries = append(p.entries, e)
	if covered(p.skip, r.Offset) {
		// Decided by an earlier owner behind an undecided message.
		e.state = done
		p.decided++
		p.advance()
		s.skipped.Add(1)
	} else {
		p.fetched(e)
	}
	if e.notBefore.After(now) {
		s.wakeAt(e.notBefore.Sub(now))
	}
}

// wakeAt wakes Receive after d, when a waiting message becomes due.
func (s *Source) wakeAt(d time.Duration) {
	time.AfterFunc(d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.broadcast()
	})
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

// onAssigned takes the partitions the group gave this member.
func (s *Source) onAssigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	var where []string
	s.mu.Lock()
	for topic, ids := range assigned {
		for _, id := range ids {
			p := s.newPartition(topic, id)
			s.parts[tp{topic, id}] = p
			s.ring = append(s.ring, p)
			where = append(where, topic+"/"+p.idText)
		}
	}
	s.mu.Unlock()
	if len(where) == 0 {
		return
	}
	cl.ResumeFetchPartitions(assigned) // a pause outlives the assignment it was made in
	s.assigned.Add(int64(len(where)))
	s.log().Info("idemq kafka: partitions assigned", "group", s.cfg.group, "partitions", strings.Join(where, ","))
}

// adjust learns where the member starts each assigned partition: the
// committed offset and what its commit metadata says is decided above it,
// or, for a partition without a commit, the real start offset, which the
// first commit then pins even if no message arrives (a group starting at
// the end would otherwise skip, on a restart, what was published before
// its first message).
func (s *Source) adjust(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	var fresh, topics []string
	s.mu.Lock()
	for topic, ps := range offsets {
		topics = append(topics, topic)
		for id, o := range ps {
			if p := s.parts[tp{topic, id}]; p != nil && o.EpochOffset().Offset >= 0 {
				p.committed, p.next = o.EpochOffset().Offset, o.EpochOffset().Offset
			} else if p != nil && !slices.Contains(fresh, topic) {
				fresh = append(fresh, topic)
			}
		}
	}
	s.mu.Unlock()
	commits, err := s.adm.FetchOffsetsForTopics(ctx, s.cfg.group, topics...)
	if err != nil {
		s.log().Warn("idemq kafka: reading commit metadata failed; messages decided behind an undecided one will be redelivered", "group", s.cfg.group, "error", err)
	}
	var starts kadm.ListedOffsets
	if len(fresh) > 0 {
		list := s.adm.ListStartOffsets
		if s.cfg.start == StartLast {
			list = s.adm.ListEndOffsets
		}
		if starts, err = list(ctx, fresh...); err != nil {
			s.log().Warn("idemq kafka: resolving start offsets failed; fetching from the relative start", "group", s.cfg.group, "error", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for topic, ps := range offsets {
		for id := range ps {
			p := s.parts[tp{topic, id}]
			if p == nil {
				continue
			}
			if c, ok := commits.Lookup(topic, id); ok && c.Err == nil && p.committed >= 0 && c.At == p.committed {
				high, spans, err := decodeProgress(c.At, c.Metadata)
				if err != nil {
					s.log().Warn("idemq kafka: ignoring unreadable commit metadata", "topic", topic, "partition", id, "error", err)
				}
				p.prevHigh, p.skip = high, spans
			}
			if l, ok := starts.Lookup(topic, id); ok && l.Err == nil && p.committed < 0 {
				p.next, p.dirty = l.Offset, true
				ps[id] = kgo.NewOffset().At(l.Offset)
			}
		}
	}
	return offsets, nil
}

// onRevoked gives up partitions the group takes from this member: they
// stop handing out messages at once; those handed out get the revoke
// timeout to settle (none when closing), while the other partitions go
// on; then settlements are refused, the decided prefix is committed and
// the rest is left to the next owner.
func (s *Source) onRevoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	ps := s.detach(revoked, false)
	if len(ps) == 0 {
		return
	}
	timeout := time.NewTimer(s.cfg.revokeTimeout)
	defer timeout.Stop()
	s.mu.Lock()
	for expired := false; inFlight(ps) > 0 && !s.closed && !expired; {
		ch := s.watch()
		s.mu.Unlock()
		select {
		case <-ch:
		case <-timeout.C:
			expired = true
		}
		s.mu.Lock()
	}
	left, closing := inFlight(ps), s.closed
	s.kill(ps) // dead before the last commit: a later settlement is refused, not accepted and never committed
	s.mu.Unlock()
	if left > 0 && !closing {
		s.log().Warn("idemq kafka: revoke timeout passed with messages in flight; their partitions' next owner gets them", "in_flight", left, "timeout", s.cfg.revokeTimeout)
	}
	s.commit(ps)
	s.released(ps, "idemq kafka: partitions released")
}

// onLost gives up partitions the member lost without a revocation (its
// session expired, it was fenced): nothing is committed for them.
func (s *Source) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	if ps := s.detach(lost, true); len(ps) > 0 {
		s.released(ps, "idemq kafka: partitions lost; their next owner gets what was not committed")
	}
}

// detach takes the named partitions out of the hand-out rotation, and
// kills them at once when dead.
func (s *Source) detach(named map[string][]int32, dead bool) []*partition {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ps []*partition
	for topic, ids := range named {
		for _, id := range ids {
			if p := s.parts[tp{topic, id}]; p != nil && !p.revoking {
				p.revoking = true
				ps = append(ps, p)
			}
		}
	}
	var keep []*partition
	for _, p := range s.ring {
		if !p.revoking {
			keep = append(keep, p)
		}
	}
	s.ring, s.rr = keep, 0
	if dead {
		s.kill(ps)
	}
	return ps
}

// kill marks ps given up: their settlements are stale. s.mu is held.
func (s *Source) kill(ps []*partition) {
	for _, p := range ps {
		p.dead = true
		if k := (tp{p.topic, p.id}); s.parts[k] == p {
			delete(s.parts, k)
		}
	}
	s.broadcast()
}

// released keeps the hand-out counts of ps's messages not committed, for
// the next Source of this process that gets them, and logs what.
func (s *Source) released(ps []*partition, what string) {
	var where []string
	s.mu.Lock()
	for _, p := range ps {
		where = append(where, p.topic+"/"+p.idText)
		for _, e := range p.entries {
			if e.handouts > 0 && e.r.Offset >= p.committed {
				carried.m.Requeued(p.offsetKey(e.r.Offset), e.handouts)
				carried.n.Add(1)
			}
		}
	}
	s.mu.Unlock()
	s.revoked.Add(int64(len(ps)))
	s.log().Info(what, "group", s.cfg.group, "partitions", strings.Join(where, ","))
}

func inFlight(ps []*partition) int {
	n := 0
	for _, p := range ps {
		n += p.out
	}
	return n
}

// commitLoop commits every commit interval, and sooner once commitCount
// messages were decided, until ctx ends.
func (s *Source) commitLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.commitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
		s.commit(nil)
	}
}

// commit commits the decided prefix of ps (nil: of every partition not
// given up), and in each commit's metadata what is decided above it.
func (s *Source) commit(ps []*partition) {
	s.commitMu.Lock() // one commit at a time, each of the state when it began
	defer s.commitMu.Unlock()
	offsets := map[string]map[int32]kgo.EpochOffset{}
	mds := map[tp]string{}
	sent := map[*partition]int64{}
	s.mu.Lock()
	if ps == nil {
		s.decided = 0
		for _, p := range s.parts {
			ps = append(ps, p)
		}
	}
	for _, p := range ps {
		cp := p.next // the first undecided offset, or the one after the last fetched
		if len(p.entries) > 0 {
			cp = p.entries[0].r.Offset
		}
		if cp < 0 || (cp <= p.committed && !p.dirty) {
			continue
		}
		p.dirty, sent[p] = false, cp
		if offsets[p.topic] == nil {
			offsets[p.topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[p.topic][p.id] = kgo.EpochOffset{Epoch: -1, Offset: cp}
		mds[tp{p.topic, p.id}] = encodeProgress(cp, max(p.high, p.prevHigh), p.progress())
	}
	s.mu.Unlock()
	if len(sent) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			for j := range req.Topics[i].Partitions {
				rp := &req.Topics[i].Partitions[j]
				if md, ok := mds[tp{req.Topics[i].Topic, rp.Partition}]; ok {
					rp.Metadata = &md
				}
			}
		}
		return nil
	})
	var err error
	s.member.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, cerr error) {
		if err = cerr; resp == nil {
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				err = cmp.Or(err, kerr.ErrorForCode(p.ErrorCode))
			}
		}
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.commitErrs.Add(1)
		s.log().Warn("idemq kafka: offset commit failed; messages decided since the last commit are redelivered if their partitions move, and decided Duplicate", "group", s.cfg.group, "error", err)
	} else {
		s.commits.Add(1)
	}
	for p, cp := range sent {
		if err != nil {
			p.dirty = true // try again with the next commit
		} else {
			p.committed = max(p.committed, cp)
		}
	}
}

// carried holds the hand-out counts of messages whose partition left a
// Source of this process before the group committed past them, for the
// next Source to fetch them: Kafka keeps no delivery count, so Attempt is
// this process's. n counts what was ever kept, so that fetching takes no
// lock while nothing was.
var carried = struct {
	n atomic.Int64
	m *attempts.Memo[offsetKey]
}{m: attempts.New[offsetKey](100_000)}

// offsetKey names a message of a partition of a group in a cluster.
type offsetKey struct {
	brokers, group, topic string
	id                    int32
	offset                int64
}

func (p *partition) offsetKey(offset int64) offsetKey {
	return offsetKey{strings.Join(p.src.cfg.brokers, ","), p.src.cfg.group, p.topic, p.id, offset}
}
