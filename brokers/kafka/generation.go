package kafka

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/unsettled"
	"github.com/idemq/idemq/internal/retry"
)

// generation is this member's share of one consumer group generation: the
// partitions assigned to it and the deliveries handed out from them.
type generation struct {
	kgen                     *kafkago.Generation
	parts                    []*partition
	revoked, dead            bool // no more hand-outs; settlements refused (the partitions are released)
	outstanding, sinceCommit int  // deliveries handed out and unsettled; messages decided since the last commit
	kick                     chan struct{}
	commitMu                 sync.Mutex // one commit at a time
}

// partition tracks one assigned partition between fetch and commit.
type partition struct {
	gen           *generation
	topic, idText string // idText: the id in decimal, for every message's metadata
	id            int
	retry, dirty  bool     // a partition of the retry topic; something to commit
	entries       []*entry // fetched and not below the commit point, in offset order
	// The entries waiting to go out, arranged for pick (see picker.go).
	order   Ordering
	lanes   map[string]*lane // OrderPerKey: per key, while in play
	one     *lane            // OrderPerPartition: the partition's lane
	fresh   fifo             // may go now, fetched so, in offset order
	ready   keyHeap          // may go now, the others, by offset
	delayed keyHeap          // may go once their notBefore passes, by it
	// next follows the last fetched offset (negative until known); high is
	// the highest handed out, prevHigh and skip the highest handed out and
	// the offsets decided before, per the commit metadata.
	next, committed, high, prevHigh int64
	skip                            []span
	// room, while the fetcher waits for fewer than resume entries, is
	// closed by advance.
	room   chan struct{}
	resume int
}

type entryState int

const (
	waiting entryState = iota
	out
	done
)

// entry is one fetched message.
type entry struct {
	p         *partition
	msg       kafkago.Message
	state     entryState
	notBefore time.Time
	baseTry   int   // attempts recorded in the message itself (retry topic)
	handouts  int   // times this process handed it out (see attempts)
	lane      *lane // the lane it waits in; nil when nothing orders it
}

func (s *Source) newGeneration(kgen *kafkago.Generation) *generation {
	g := &generation{kgen: kgen, kick: make(chan struct{}, 1)}
	for topic, as := range kgen.Assignments {
		for _, a := range as {
			g.parts = append(g.parts, &partition{
				gen: g, topic: topic, id: a.ID, idText: strconv.Itoa(a.ID), retry: topic == s.cfg.retryTopic && topic != "",
				next: a.Offset, committed: a.Offset, order: s.cfg.ordering,
				// Resume fetching at three quarters of the buffer, so that a
				// woken fetcher fetches a run, not one message per settlement.
				high: -1, prevHigh: -1, resume: max(1, s.cfg.partitionBuffer-s.cfg.partitionBuffer/4),
			})
		}
	}
	// Deterministic order so the round-robin visits partitions fairly.
	slices.SortFunc(g.parts, func(a, b *partition) int { return cmp.Or(strings.Compare(a.topic, b.topic), a.id-b.id) })
	return g
}

// runGeneration fetches the generation's partitions and commits their
// decided prefixes until the generation ends; then it revokes: no more
// hand-outs, in-flight deliveries get the revoke timeout to settle (none on
// Close), the decided prefix is committed, the partitions are released.
func (s *Source) runGeneration(ctx context.Context, g *generation) {
	log := s.log().With("group", s.cfg.group, "generation", g.kgen.ID)
	s.prepare(g, log)
	var where []string
	for _, p := range g.parts {
		where = append(where, p.topic+"/"+p.idText+"@"+strconv.FormatInt(p.next, 10))
	}
	log.Info("idemq kafka: partitions assigned", "partitions", strings.Join(where, ","))
	s.change(func() { s.gen, s.rr = g, 0 })

	fctx, stopFetch := context.WithCancel(context.Background())
	var fetchers sync.WaitGroup
	for _, p := range g.parts {
		r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: s.cfg.brokers, Topic: p.topic, Partition: p.id, Dialer: s.cfg.dialer,
			MinBytes: 1, MaxBytes: 1 << 20, MaxWait: s.cfg.fetchMaxWait, QueueCapacity: min(s.cfg.partitionBuffer, 100), ErrorLogger: kafkaLogger(s.log())})
		if err := r.SetOffset(p.next); err != nil {
			log.Warn("idemq kafka: setting the fetch offset", "topic", p.topic, "partition", p.id, "error", err)
		}
		fetchers.Go(func() {
			defer r.Close()
			s.fetch(fctx, p, r)
		})
	}

	ticker := time.NewTicker(s.cfg.commitInterval)
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case <-ticker.C:
		case <-g.kick:
		}
		s.commit(g, log)
	}
	ticker.Stop()

	var closing bool
	s.change(func() { g.revoked, closing = true, s.closed })
	stopFetch() // fetchers add nothing once revoked; their readers close meanwhile

	// kafka-go stopped heartbeating; keep the membership alive while
	// in-flight work finishes, so a revoke wait longer than the session
	// timeout does not get this member evicted and its last commit refused.
	stopHeartbeats := s.heartbeat(g)
	defer stopHeartbeats()
	if !closing && s.cfg.revokeTimeout > 0 {
		wctx, cancel := context.WithTimeout(s.ctx, s.cfg.revokeTimeout)
		s.mu.Lock()
		for g.outstanding > 0 && !s.closed && wctx.Err() == nil {
			ch := s.watch()
			s.mu.Unlock()
			select {
			case <-ch:
			case <-wctx.Done():
			}
			s.mu.Lock()
		}
		left := g.outstanding
		s.mu.Unlock()
		cancel()
		if left > 0 {
			log.Warn("idemq kafka: revoke timeout passed with deliveries in flight; they will be redelivered to the next owner", "in_flight", left, "timeout", s.cfg.revokeTimeout)
		}
	}
	// Dead before the last commit: a settlement from now on is refused
	// (stale) rather than accepted and then never committed.
	s.change(func() {
		g.dead = true
		if s.gen == g {
			s.gen = nil
		}
	})
	s.commit(g, log)
	stopHeartbeats()
	fetchers.Wait()
	s.rememberAttempts(g)
	log.Info("idemq kafka: partitions released")
}

// heartbeat sends g's member heartbeats until the returned func is called
// (once or more).
func (s *Source) heartbeat(g *generation) func() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var coordinator net.Addr // kafka-go routes heartbeats to Addr, not to the coordinator
	wg.Go(func() {
		unsettled.Heartbeat(ctx, s.cfg.heartbeatInterval, func(time.Time) {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.sessionTimeout)
			defer cancel()
			if coordinator == nil {
				fc, err := s.client.FindCoordinator(ctx, &kafkago.FindCoordinatorRequest{Key: s.cfg.group, KeyType: kafkago.CoordinatorKeyTypeConsumer})
				if err == nil && fc.Error == nil && fc.Coordinator != nil {
					coordinator = kafkago.TCP(net.JoinHostPort(fc.Coordinator.Host, strconv.Itoa(fc.Coordinator.Port)))
				}
			}
			if coordinator != nil {
				resp, err := s.client.Heartbeat(ctx, &kafkago.HeartbeatRequest{Addr: coordinator, GroupID: s.cfg.group, GenerationID: g.kgen.ID, MemberID: g.kgen.MemberID})
				if err != nil || (resp.Error != nil && !errors.Is(resp.Error, kafkago.RebalanceInProgress)) {
					coordinator = nil // look it up again next time
				}
			}
		})
	})
	return func() { cancel(); wg.Wait() }
}

// fetch reads one partition into its entries, pausing at
// WithPartitionBuffer messages until it is down to p.resume.
func (s *Source) fetch(ctx context.Context, p *partition, r *kafkago.Reader) {
	backoff := retry.New(50*time.Millisecond, 5*time.Second)
	for {
		s.mu.Lock()
		for full := len(p.entries) >= s.cfg.partitionBuffer; full && len(p.entries) >= p.resume && ctx.Err() == nil; {
			if p.room == nil {
				p.room = make(chan struct{})
			}
			room := p.room
			s.mu.Unlock()
			select {
			case <-room:
			case <-ctx.Done():
			}
			s.mu.Lock()
		}
		s.mu.Unlock()
		m, err := r.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log().Warn("idemq kafka: fetch failed", "topic", p.topic, "partition", p.id, "error", err)
			if !backoff.Wait(ctx) {
				return
			}
			continue
		}
		backoff.Reset()
		e := &entry{p: p, msg: m}
		if p.retry {
			e.notBefore, e.baseTry = retryHeaders(m.Headers)
		}
		s.mu.Lock()
		if p.gen.revoked {
			s.mu.Unlock()
			return
		}
		p.next = m.Offset + 1
		p.entries = append(p.entries, e)
		if covered(p.skip, m.Offset) {
			// Decided by an earlier owner behind an undecided message.
			e.state = done
			p.advance()
			s.skipped.Add(1)
		} else {
			p.fetched(e)
		}
		// Read under the lock: once e is in the partition, a settlement
		// may set its notBefore.
		wait := time.Until(e.notBefore)
		s.broadcast()
		s.mu.Unlock()
		if wait > 0 {
			s.wakeAt(wait)
		}
	}
}

// wakeAt wakes Receive after d, when a held message becomes due.
func (s *Source) wakeAt(d time.Duration) { time.AfterFunc(d, func() { s.change(func() {}) }) }

// change runs f under s.mu and wakes the waiters.
func (s *Source) change(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
	s.broadcast()
}

// pick chooses the next message to hand out, visiting the partitions
// round-robin. s.mu is held.
func (s *Source) pick(now time.Time) *entry {
	g := s.gen
	for i := 0; g != nil && !g.revoked && i < len(g.parts); i++ {
		k := (s.rr + i) % len(g.parts)
		if e := g.parts[k].pick(now); e != nil {
			s.rr = (k + 1) % len(g.parts)
			return e
		}
	}
	return nil
}

// handOut turns e into a delivery. s.mu is held.
func (s *Source) handOut(e *entry) *delivery {
	p := e.p
	e.state, p.dirty = out, true
	p.gen.outstanding++
	s.outstanding++
	p.high = max(p.high, e.msg.Offset)
	if e.handouts == 0 {
		e.handouts = attempts.take(s.attemptKey(p), e.msg.Offset)
	}
	e.handouts++
	n := e.handouts
	if n == 1 && e.msg.Offset <= p.prevHigh {
		n = 2 // handed out before, by this or another process
	}
	d := &delivery{src: s, e: e, gen: p.gen}
	d.msg = &d.m
	s.fillMessage(d.msg, e, e.baseTry+n)
	d.m.Metadata = (*metadata)(d)
	return d
}

// settleLocked marks claimed d's message done (requeue nil) or puts it
// back to wait *requeue, and wakes the waiters. s.mu is held.
func (s *Source) settleLocked(d *delivery, requeue *time.Duration) error {
	defer s.broadcast()
	return s.settleQuietly(d, requeue)
}

// staleness returns the error of a settlement of d that must send nothing
// (its partition was revoked or the Source closed). s.mu is held.
func (s *Source) staleness(d *delivery) error {
	switch {
	case d.gen.dead:
		return driver.Stale(errRevoked)
	case s.closed:
		return driver.Stale(unsettled.ErrClosed)
	}
	return nil
}

// settleQuietly is settleLocked without the wake-up, for a batch that
// wakes the waiters once. It undoes handOut's counts and frees the lane.
func (s *Source) settleQuietly(d *delivery, requeue *time.Duration) error {
	e, g := d.e, d.gen
	stale := s.staleness(d)
	retry := stale == nil && requeue != nil
	if retry {
		e.state, e.notBefore = waiting, time.Now().Add(*requeue)
	}
	s.outstanding--
	if !g.dead {
		e.p.settled(e, retry)
		g.outstanding--
	}
	switch {
	case stale != nil:
		s.stale.Add(1)
		return stale
	case retry:
		if *requeue > 0 {
			s.wakeAt(*requeue)
		}
		return nil
	}
	e.state, e.p.dirty = done, true
	e.p.advance()
	if g.sinceCommit++; g.sinceCommit >= s.cfg.commitCount {
		select {
		case g.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// advance drops the contiguous decided prefix. s.mu is held.
func (p *partition) advance() {
	i := 0
	for i < len(p.entries) && p.entries[i].state == done {
		i++
	}
	clear(p.entries[:i])
	p.entries = p.entries[i:]
	if p.room != nil && len(p.entries) < p.resume {
		close(p.room)
		p.room = nil
	}
}

// progress returns the decided runs above the commit point, fetched or
// inherited from the previous owner and not fetched yet. s.mu is held.
func (p *partition) progress() []span {
	var out []span
	for i := 0; i < len(p.entries); i++ {
		if p.entries[i].state != done {
			continue
		}
		j := i
		for j+1 < len(p.entries) && p.entries[j+1].state == done {
			j++
		}
		first, last := p.entries[i].msg.Offset, p.entries[j].msg.Offset
		out = append(out, span{first, last - first + 1})
		i = j
	}
	return append(out, dropBelow(p.skip, p.next)...)
}

// commit commits every partition's decided prefix, and in the metadata
// what is decided above it.
func (s *Source) commit(g *generation, log *slog.Logger) {
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	offsets := map[string][]kafkago.OffsetCommit{}
	sent := map[*partition]int64{}
	s.mu.Lock()
	g.sinceCommit = 0
	for _, p := range g.parts {
		cp := p.next // the first undecided offset, or the one after the last fetched
		if len(p.entries) > 0 {
			cp = p.entries[0].msg.Offset
		}
		if cp >= 0 && (cp > p.committed || p.dirty) {
			p.dirty, sent[p] = false, cp
			md := encodeProgress(cp, max(p.high, p.prevHigh), p.progress())
			offsets[p.topic] = append(offsets[p.topic], kafkago.OffsetCommit{Partition: p.id, Offset: cp, Metadata: md})
		}
	}
	s.mu.Unlock()
	if len(sent) == 0 {
		return
	}
	resp, err := bounded(s.client.OffsetCommit, &kafkago.OffsetCommitRequest{GroupID: s.cfg.group, GenerationID: int(g.kgen.ID), MemberID: g.kgen.MemberID, Topics: offsets})
	if err != nil {
		resp = &kafkago.OffsetCommitResponse{}
	}
	failed := map[string][]int{}
	for topic, ps := range resp.Topics {
		for _, pr := range ps {
			if pr.Error != nil {
				err, failed[topic] = pr.Error, append(failed[topic], pr.Partition)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.commitErrs.Add(1)
		log.Warn("idemq kafka: offset commit failed; messages decided since the last commit will be redelivered and decided Duplicate", "error", err)
	} else {
		s.commits.Add(1)
	}
	for p, cp := range sent {
		if (err != nil && failed[p.topic] == nil) || slices.Contains(failed[p.topic], p.id) {
			p.dirty = true // try again with the next commit
		} else if cp > p.committed {
			p.committed = cp
			attempts.forgetBelow(s.attemptKey(p), cp)
		}
	}
}

// prepare reads the commit metadata of the assigned partitions, and turns
// the start offset of those without a committed offset (FirstOffset or
// LastOffset) into a real one, so that the first commit pins it even if no
// message arrives: otherwise a group starting at LastOffset would skip
// what is published before its first message whenever it restarts.
func (s *Source) prepare(g *generation, log *slog.Logger) {
	freq := &kafkago.OffsetFetchRequest{GroupID: s.cfg.group, Topics: map[string][]int{}}
	lreq := &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{}}
	for _, p := range g.parts {
		freq.Topics[p.topic] = append(freq.Topics[p.topic], p.id)
		if p.next < 0 {
			lreq.Topics[p.topic] = append(lreq.Topics[p.topic], kafkago.OffsetRequest{Partition: p.id, Timestamp: p.next})
		}
	}
	fresp, lresp := &kafkago.OffsetFetchResponse{}, &kafkago.ListOffsetsResponse{}
	var err error
	if len(g.parts) > 0 {
		if fresp, err = bounded(s.client.OffsetFetch, freq); err == nil && fresp.Error != nil {
			err = fresp.Error
		}
		if err != nil {
			fresp = &kafkago.OffsetFetchResponse{}
			log.Warn("idemq kafka: reading commit metadata failed; messages decided behind an undecided one will be redelivered", "error", err)
		}
	}
	if len(lreq.Topics) > 0 {
		if lresp, err = bounded(s.client.ListOffsets, lreq); err != nil {
			lresp = &kafkago.ListOffsetsResponse{}
			log.Warn("idemq kafka: resolving start offsets failed; fetching from the relative start", "error", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range g.parts {
		for _, fp := range fresp.Topics[p.topic] {
			if fp.Partition != p.id || fp.Error != nil || fp.CommittedOffset != p.committed {
				continue
			}
			high, spans, err := decodeProgress(fp.CommittedOffset, fp.Metadata)
			if err != nil {
				log.Warn("idemq kafka: ignoring unreadable commit metadata", "topic", p.topic, "partition", p.id, "error", err)
				continue
			}
			p.prevHigh, p.skip = high, spans
		}
		for _, po := range lresp.Topics[p.topic] {
			switch {
			case p.next >= 0 || po.Partition != p.id || po.Error != nil:
			case p.next == kafkago.FirstOffset && po.FirstOffset >= 0:
				p.next = po.FirstOffset
			case p.next == kafkago.LastOffset && po.LastOffset >= 0:
				p.next = po.LastOffset
			}
		}
	}
}

// bounded sends req with call within 10 seconds: the group's own calls
// have no caller's context.
func bounded[Req, Resp any](call func(context.Context, Req) (Resp, error), req Req) (Resp, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return call(ctx, req)
}

// rememberAttempts moves the hand-out counts of g's entries that are not
// committed into the process-wide attempts, for the next Source of this
// process to fetch them.
func (s *Source) rememberAttempts(g *generation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range g.parts {
		for _, e := range p.entries {
			if e.handouts > 0 && e.msg.Offset >= p.committed {
				attempts.remember(s.attemptKey(p), e.msg.Offset, e.handouts)
			}
		}
	}
}

func (s *Source) attemptKey(p *partition) partKey { return partKey{s.bkey, s.cfg.group, p.topic, p.id} }
