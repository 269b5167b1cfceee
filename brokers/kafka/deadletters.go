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
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
)

// ErrDeadLettersFragmented is returned (wrapped) by Redrive and Purge when
// the records handled out of order on a partition no longer fit in the
// commit's metadata (see DeadLetters): handle its oldest ones first.
var ErrDeadLettersFragmented = errors.New("kafka: too many dead letters handled out of order")

// maxDeadLetterMetadata is the longest offset-commit metadata DeadLetters
// writes: the brokers' default offset.metadata.max.bytes.
const maxDeadLetterMetadata = 4096

// DeadLetters is the operator's handle on the dead letters one consumer
// or share group parked (driver.DeadLetters, driver.Redriver): Redrive
// produces them back to the partition they were consumed from (by key when
// it is gone). Each call reads the topic up to its end when the call
// began, and skips other groups' records (HeaderGroup).
//
// A Kafka topic cannot delete single records, so a handled record is
// recorded in a bookkeeping group (WithDeadLetterGroup): its committed
// offset passes every record below the first one still parked, and the
// ones handled above it are ranges in the commit's metadata; past 4096
// bytes, Redrive and Purge stop with ErrDeadLettersFragmented (Redrive
// before producing). Resetting the group's offsets lists every retained
// dead letter again. One DeadLetters per bookkeeping group should work at a
// time (two may lose each other's bookkeeping; records then come back); it
// is not safe for concurrent use.
type DeadLetters struct {
	*deadletter.Queue[*letter]
	st *dlqStore
}

// dlqStore is the dead-letter topic as a deadletter.Store.
type dlqStore struct {
	cfg    config
	group  string // the bookkeeping group
	cl     *kgo.Client
	adm    *kadm.Client
	writer *kgo.Client // redrives, made at the first
	log    func() *slog.Logger
}

var _ driver.Redriver = (*DeadLetters)(nil)

// OpenDeadLetters opens the dead letters of the consumer or share group a
// source opened with the same addr (kafka:// or kafka+share://) and
// options parks (the consumer options are checked and ignored). It checks
// that the brokers answer; a dead-letter topic that does not exist yet
// holds no dead letters.
func OpenDeadLetters(ctx context.Context, addr string, opts ...Option) (*DeadLetters, error) {
	cfg, err := sourceConfig(addr, opts, Scheme, ShareScheme)
	if err != nil {
		return nil, err
	}
	group := cfg.deadLetterGroup
	if group == "" {
		group = cfg.group + ".dlq-operator"
		if err := checkGroup(group); err != nil {
			return nil, optErr(cfg.name("WithDeadLetterGroup"), "the default %v; name one", err)
		}
	}
	logger := cmp.Or(cfg.logger, slog.Default())
	q := &dlqStore{cfg: cfg, group: group, log: func() *slog.Logger { return logger }}
	if q.cl, err = kgo.NewClient(cfg.kgoOpts(q.log)...); err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	q.adm = kadm.NewClient(q.cl)
	if err := cfg.probe(ctx, q.cl); err != nil {
		q.Close()
		return nil, err
	}
	return &DeadLetters{deadletter.New[*letter](q), q}, nil
}

// Group returns the bookkeeping group that records what was handled.
func (q *DeadLetters) Group() string { return q.st.group }

// Name returns the dead-letter topic.
func (q *dlqStore) Name() string { return q.cfg.deadLetterTopic }

// Close releases the connections.
func (q *dlqStore) Close() error {
	if q.writer != nil {
		q.writer.Close()
	}
	q.cl.Close()
	return nil
}

// dlqPart is one partition of the dead-letter topic as a call sees it.
type dlqPart struct {
	id        int32
	committed int64  // the bookkeeping group's committed offset, -1 none
	handled   []span // handled records above committed, sorted, disjoint
	from, end int64  // the records the call reads: [from, end)
	kept      int64  // the first dead letter the call left parked, -1 none
}

// letter is one of the group's dead letters read by a call.
type letter struct {
	p       *dlqPart
	r       *kgo.Record
	parked  *driver.Parked
	removed bool
}

// Each implements deadletter.Store: the group's dead letters not handled,
// in offset order per partition. Once it removed any of a partition's, the
// bookkeeping commit passes other records and gaps up to the first left.
func (q *dlqStore) Each(ctx context.Context, fn func(*letter, *driver.Parked) error) error {
	parts, err := q.load(ctx)
	if err != nil {
		return err
	}
	for _, p := range parts {
		removed := false
		err := q.read(ctx, p, func(r *kgo.Record) error {
			if r.Offset < p.committed || covered(p.handled, r.Offset) {
				return nil // handled, in this call or before
			}
			l := q.letter(p, r)
			if l == nil {
				return nil
			}
			if err := fn(l, l.parked); err != nil {
				return err
			}
			removed = removed || l.removed
			if !l.removed && p.kept < 0 {
				p.kept = r.Offset
			}
			return nil
		})
		if err != nil {
			return err
		}
		if point := p.upTo(p.end); removed && point > p.committed && point > p.from {
			if err := q.record(ctx, p, point, -1); err != nil {
				return err
			}
		}
	}
	return nil
}

// read calls fn with each record of p from p.from below p.end, in order.
func (q *dlqStore) read(ctx context.Context, p *dlqPart, fn func(*kgo.Record) error) error {
	if p.from >= p.end {
		return nil
	}
	topic := q.cfg.deadLetterTopic
	cl, err := kgo.NewClient(append(q.cfg.kgoOpts(q.log), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {p.id: kgo.NewOffset().At(p.from)}}))...)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer cl.Close()
	for next := p.from; next < p.end; {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				ferr = cmp.Or(ferr, err)
			}
		})
		if ferr != nil {
			return fmt.Errorf("kafka: dead-letter topic %q partition %d: fetching at %d: %w", topic, p.id, next, q.cfg.explain(ferr))
		}
		read := false
		for _, r := range fs.Records() {
			if r.Offset < next || r.Offset >= p.end {
				continue
			}
			next, read = r.Offset+1, true
			if err := fn(r); err != nil {
				return err
			}
		}
		if !read {
			return nil // nothing readable is left below the end
		}
	}
	return nil
}

// Remove implements deadletter.Store: it records l as handled.
func (q *dlqStore) Remove(ctx context.Context, l *letter) error {
	err := q.record(ctx, l.p, l.p.upTo(l.r.Offset+1), l.r.Offset)
	l.removed = err == nil
	return err
}

// upTo is the commit point of a call that handled everything it read
// below next: next, or the first dead letter it left parked.
func (p *dlqPart) upTo(next int64) int64 {
	if p.kept >= 0 {
		return p.kept
	}
	return next
}

// load reads the dead-letter topic's partitions, their offsets and the
// bookkeeping group's commits. A missing topic holds nothing.
func (q *dlqStore) load(ctx context.Context) ([]*dlqPart, error) {
	topic := q.cfg.deadLetterTopic
	td, err := q.adm.ListTopics(ctx, topic)
	if err == nil && !errors.Is(td[topic].Err, kerr.UnknownTopicOrPartition) {
		err = td[topic].Err
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: dead-letter topic %q: %w", topic, q.cfg.explain(err))
	}
	if len(td[topic].Partitions) == 0 {
		return nil, nil
	}
	starts, err := q.adm.ListStartOffsets(ctx, topic)
	ends, err2 := q.adm.ListEndOffsets(ctx, topic)
	if err = cmp.Or(err, err2, starts.Error(), ends.Error()); err != nil {
		return nil, fmt.Errorf("kafka: dead-letter topic %q: listing offsets: %w", topic, err)
	}
	commits, err := q.adm.FetchOffsets(ctx, q.group)
	if err == nil {
		err = commits.Error()
	}
	if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		return nil, fmt.Errorf("kafka: dead-letter group %q: reading its offsets: %w", q.group, err)
	}
	var parts []*dlqPart
	for id := range td[topic].Partitions {
		s, _ := starts.Lookup(topic, id)
		e, _ := ends.Lookup(topic, id)
		p := &dlqPart{id: id, committed: -1, kept: -1, from: s.Offset, end: e.Offset}
		// None, or one past the end: the topic was deleted and created
		// again, and its records are all new.
		if c, ok := commits.Lookup(topic, id); ok && c.At >= 0 && c.At <= p.end {
			_, spans, err := decodeProgress(c.At, c.Metadata)
			if err != nil {
				return nil, fmt.Errorf("kafka: dead-letter group %q partition %d: unreadable commit metadata: %w", q.group, id, err)
			}
			p.committed, p.handled, p.from = c.At, spans, max(p.from, c.At)
		}
		parts = append(parts, p)
	}
	slices.SortFunc(parts, func(a, b *dlqPart) int { return cmp.Compare(a.id, b.id) })
	return parts, nil
}

// letter converts a record of p into a dead letter, nil when another
// group parked it.
func (q *dlqStore) letter(p *dlqPart, r *kgo.Record) *letter {
	h := make(map[string]string, len(r.Headers))
	for _, kh := range r.Headers {
		h[kh.Key] = string(kh.Value) // the last of repeated keys wins, as for a received message
	}
	if g, ok := h[HeaderGroup]; ok && g != q.cfg.group {
		return nil
	}
	l := &letter{p: p, r: r, parked: &driver.Parked{Ref: strconv.Itoa(int(p.id)) + "/" + strconv.FormatInt(r.Offset, 10), ID: h[q.cfg.idHeader],
		ParkedAt: r.Timestamp, Key: string(r.Key), Headers: h, Body: r.Value}}
	deadletter.Read(l.parked)
	l.parked.Destination = cmp.Or(l.parked.Destination, q.cfg.topic)
	return l
}

// plan works out the commit of point for p: the point past the handled
// records right above it, those above that, and the metadata; done (if not
// -1) among them. One that cannot be written fails before anything is done.
func (q *dlqStore) plan(p *dlqPart, point, done int64) (int64, []span, string, error) {
	handled := p.handled
	if done >= 0 {
		handled = addSpan(handled, done)
	}
	for _, s := range handled { // pass handled records right above point
		if s.start <= point {
			point = max(point, s.end())
		}
	}
	md, ok := encodeSpans(point, -1, handled, maxDeadLetterMetadata)
	if !ok {
		return 0, nil, "", fmt.Errorf("%w on partition %d of %q: their ranges above offset %d need more than %d bytes of commit metadata; redrive or purge the oldest ones first", ErrDeadLettersFragmented, p.id, q.cfg.deadLetterTopic, point, maxDeadLetterMetadata)
	}
	return point, dropBelow(handled, point), md, nil
}

// record commits point for p in the bookkeeping group, with done (if not
// -1) among the handled records above it.
func (q *dlqStore) record(ctx context.Context, p *dlqPart, point, done int64) error {
	point, handled, md, err := q.plan(p, point, done)
	if err != nil {
		return err
	}
	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: q.cfg.deadLetterTopic, Partition: p.id, At: point, LeaderEpoch: -1, Metadata: md})
	// A group without members: Kafka takes the commit as it is.
	resp, err := q.adm.CommitOffsets(ctx, q.group, os)
	if err == nil {
		err = resp.Error()
	}
	if errors.Is(err, kerr.OffsetMetadataTooLarge) {
		err = fmt.Errorf("%w: %w; redrive or purge the oldest ones first", err, ErrDeadLettersFragmented)
	}
	if err != nil {
		return fmt.Errorf("kafka: dead-letter group %q: recording partition %d up to offset %d as handled: %w", q.group, p.id, point, err)
	}
	p.committed, p.handled = point, handled
	return nil
}

// Republish implements deadletter.Store: it produces l to the partition of
// its origin with its own headers, once l could be recorded as handled.
func (q *dlqStore) Republish(ctx context.Context, l *letter, p *driver.Parked) error {
	if _, _, _, err := q.plan(l.p, l.p.upTo(l.r.Offset+1), l.r.Offset); err != nil {
		return err
	}
	if q.writer == nil {
		w, err := kgo.NewClient(append(q.cfg.kgoOpts(q.log), kgo.RecordPartitioner(partitioner{}))...)
		if err != nil {
			return fmt.Errorf("kafka: %w", err)
		}
		q.writer = w
	}
	r := &kgo.Record{Topic: p.Destination, Key: l.r.Key, Value: l.r.Value, Partition: -1}
	if f := strings.Split(p.Origin, "/"); len(f) == 3 {
		if n, err := strconv.Atoi(f[1]); err == nil {
			r.Partition = int32(n)
		}
	}
	for _, h := range l.r.Headers { // all of them, repeated ones too, in order
		if !slices.Contains(deadletter.Bookkeeping, h.Key) && h.Key != HeaderGroup && h.Key != HeaderNotBefore {
			r.Headers = append(r.Headers, h)
		}
	}
	if err := q.writer.ProduceSync(ctx, r).FirstErr(); err != nil {
		return fmt.Errorf("kafka: %w", q.cfg.explain(err))
	}
	return nil
}
