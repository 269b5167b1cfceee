package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/admin"
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
// group parked (admin.DeadLetterQueue): Redrive produces them back to the
// partition they were consumed from (by key when it is gone). Each call
// reads the topic with plain fetches up to its high watermark when the
// call began, and skips other groups' records (HeaderGroup).
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
	client *kafkago.Client
	writer *kafkago.Writer
}

var _ admin.DeadLetterQueue = (*DeadLetters)(nil)

// OpenDeadLetters opens the dead letters of the consumer group a Source
// opened with the same addr and options consumes with (the consumer options
// are checked and ignored). It checks that the brokers answer; a
// dead-letter topic that does not exist yet holds no dead letters.
func OpenDeadLetters(ctx context.Context, addr string, opts ...Option) (*DeadLetters, error) {
	cfg, err := sourceConfig(addr, opts)
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
	q := &dlqStore{cfg: cfg, group: group, client: cfg.newClient()}
	if _, err := q.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{cfg.deadLetterTopic}}); err != nil {
		q.Close()
		return nil, fmt.Errorf("kafka: brokers %v: %w", cfg.brokers, cfg.explain(err))
	}
	return &DeadLetters{deadletter.New[*letter](q), q}, nil
}

// Group returns the bookkeeping group that records what was handled.
func (q *DeadLetters) Group() string { return q.st.group }

// Name returns the dead-letter topic.
func (q *dlqStore) Name() string { return q.cfg.deadLetterTopic }

// Close releases the connections.
func (q *dlqStore) Close() error { return closeConns(q.client, q.writer) }

// dlqPart is one partition of the dead-letter topic as a call sees it.
type dlqPart struct {
	id        int
	committed int64  // the bookkeeping group's committed offset, -1 none
	handled   []span // handled records above committed, sorted, disjoint
	from, end int64  // the records the call reads: [from, end)
	kept      int64  // the first dead letter the call left parked, -1 none
}

// letter is one of the group's dead letters read by a call.
type letter struct {
	p          *dlqPart
	offset     int64
	parked     *admin.Parked
	key, value []byte
	headers    []kafkago.Header
	removed    bool
}

// Each implements deadletter.Store: the group's dead letters not handled,
// in offset order per partition. Once it removed any of a partition's, the
// bookkeeping commit passes other records and gaps up to the first left.
func (q *dlqStore) Each(ctx context.Context, fn func(*letter, *admin.Parked) error) error {
	parts, err := q.load(ctx)
	if err != nil {
		return err
	}
	topic := q.cfg.deadLetterTopic
	for _, p := range parts {
		removed := false
		for offset := p.from; offset < p.end; {
			resp, err := q.client.Fetch(ctx, &kafkago.FetchRequest{Topic: topic, Partition: p.id, Offset: offset, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond})
			if err == nil {
				err = resp.Error
			}
			if err != nil {
				return fmt.Errorf("kafka: dead-letter topic %q partition %d: fetching at %d: %w", topic, p.id, offset, err)
			}
			var batch []*letter
			read := false
			for r, err := resp.Records.ReadRecord(); err == nil; r, err = resp.Records.ReadRecord() {
				if r.Offset < offset || r.Offset >= p.end {
					continue
				}
				offset, read = r.Offset+1, true
				if covered(p.handled, r.Offset) {
					continue
				}
				l, err := q.letter(p, r)
				if err != nil {
					return err
				}
				if l != nil {
					batch = append(batch, l)
				}
			}
			for _, l := range batch {
				if err := fn(l, l.parked); err != nil {
					return err
				}
				removed = removed || l.removed
				if !l.removed && p.kept < 0 {
					p.kept = l.offset
				}
			}
			if !read {
				break // nothing readable is left below the high watermark
			}
		}
		if point := p.upTo(p.end); removed && point > p.committed && point > p.from {
			if err := q.record(ctx, p, point, -1); err != nil {
				return err
			}
		}
	}
	return nil
}

// Remove implements deadletter.Store: it records l as handled.
func (q *dlqStore) Remove(ctx context.Context, l *letter) error {
	err := q.record(ctx, l.p, l.p.upTo(l.offset+1), l.offset)
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
	md, err := q.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("kafka: dead-letter topic %q: %w", topic, q.cfg.explain(err))
	}
	parts := map[int]*dlqPart{}
	lreq := &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{}}
	freq := &kafkago.OffsetFetchRequest{GroupID: q.group, Topics: map[string][]int{}}
	for _, t := range md.Topics {
		if t.Name != topic || errors.Is(t.Error, kafkago.UnknownTopicOrPartition) {
			continue
		} else if t.Error != nil {
			return nil, fmt.Errorf("kafka: dead-letter topic %q: %w", topic, t.Error)
		}
		for _, p := range t.Partitions {
			parts[p.ID] = &dlqPart{id: p.ID, committed: -1, kept: -1}
			lreq.Topics[topic] = append(lreq.Topics[topic], kafkago.FirstOffsetOf(p.ID), kafkago.LastOffsetOf(p.ID))
			freq.Topics[topic] = append(freq.Topics[topic], p.ID)
		}
	}
	if len(parts) == 0 {
		return nil, nil
	}
	lresp, err := q.client.ListOffsets(ctx, lreq)
	if err != nil {
		return nil, fmt.Errorf("kafka: dead-letter topic %q: listing offsets: %w", topic, err)
	}
	fresp, err := q.client.OffsetFetch(ctx, freq)
	if err == nil && fresp.Error != nil && !errors.Is(fresp.Error, kafkago.GroupIdNotFound) {
		err = fresp.Error
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: dead-letter group %q: reading its offsets: %w", q.group, err)
	}
	for _, po := range lresp.Topics[topic] {
		if p := parts[po.Partition]; p != nil && po.Error != nil {
			return nil, fmt.Errorf("kafka: dead-letter topic %q partition %d: listing offsets: %w", topic, p.id, po.Error)
		} else if p != nil {
			p.from, p.end = po.FirstOffset, po.LastOffset
		}
	}
	for _, fp := range fresp.Topics[topic] {
		p := parts[fp.Partition]
		if p != nil && fp.Error != nil {
			return nil, fmt.Errorf("kafka: dead-letter group %q partition %d: %w", q.group, p.id, fp.Error)
		}
		// None, or one past the end: the topic was deleted and created
		// again, and its records are all new.
		if p == nil || fp.CommittedOffset < 0 || fp.CommittedOffset > p.end {
			continue
		}
		_, spans, err := decodeProgress(fp.CommittedOffset, fp.Metadata)
		if err != nil {
			return nil, fmt.Errorf("kafka: dead-letter group %q partition %d: unreadable commit metadata: %w", q.group, p.id, err)
		}
		p.committed, p.handled, p.from = fp.CommittedOffset, spans, max(p.from, fp.CommittedOffset)
	}
	return slices.SortedFunc(maps.Values(parts), func(a, b *dlqPart) int { return a.id - b.id }), nil
}

// letter converts a record of p into a dead letter, nil when another
// group parked it.
func (q *dlqStore) letter(p *dlqPart, r *kafkago.Record) (*letter, error) {
	l := &letter{p: p, offset: r.Offset, headers: r.Headers}
	var err error
	if r.Key != nil {
		l.key, err = io.ReadAll(r.Key)
	}
	if r.Value != nil && err == nil {
		l.value, err = io.ReadAll(r.Value)
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: dead-letter topic %q: reading record %d/%d: %w", q.cfg.deadLetterTopic, p.id, r.Offset, err)
	}
	h := make(map[string]string, len(r.Headers))
	for _, kh := range r.Headers {
		h[kh.Key] = string(kh.Value) // the last of repeated keys wins, as in toMessage
	}
	if g, ok := h[HeaderGroup]; ok && g != q.cfg.group {
		return nil, nil
	}
	l.parked = &admin.Parked{Ref: strconv.Itoa(p.id) + "/" + strconv.FormatInt(r.Offset, 10), ID: h[q.cfg.idHeader],
		ParkedAt: r.Time, Key: string(l.key), Headers: h, Body: l.value}
	deadletter.Read(l.parked)
	l.parked.Destination = cmp.Or(l.parked.Destination, q.cfg.topic)
	return l, nil
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
	// GenerationID -1: a group without members, Kafka takes the commit as it is.
	resp, err := q.client.OffsetCommit(ctx, &kafkago.OffsetCommitRequest{GroupID: q.group, GenerationID: -1,
		Topics: map[string][]kafkago.OffsetCommit{q.cfg.deadLetterTopic: {{Partition: p.id, Offset: point, Metadata: md}}}})
	if err == nil {
		for _, pr := range resp.Topics[q.cfg.deadLetterTopic] {
			if pr.Error != nil {
				err = pr.Error
			}
		}
	}
	if errors.Is(err, kafkago.OffsetMetadataTooLarge) {
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
func (q *dlqStore) Republish(ctx context.Context, l *letter, p *admin.Parked) error {
	if _, _, _, err := q.plan(l.p, l.p.upTo(l.offset+1), l.offset); err != nil {
		return err
	}
	if q.writer == nil {
		q.writer = q.cfg.newWriter(originalPartition{}, cmp.Or(q.cfg.logger, slog.Default()))
	}
	m := kafkago.Message{Topic: p.Destination, Key: l.key, Value: l.value, Partition: -1}
	if f := strings.Split(p.Origin, "/"); len(f) == 3 {
		if n, err := strconv.Atoi(f[1]); err == nil {
			m.Partition = n
		}
	}
	for _, h := range l.headers { // all of them, repeated ones too, in order
		if !slices.Contains(deadletter.Bookkeeping, h.Key) && h.Key != HeaderGroup && h.Key != HeaderNotBefore {
			m.Headers = append(m.Headers, h)
		}
	}
	if err := q.writer.WriteMessages(ctx, m); err != nil {
		return fmt.Errorf("kafka: %w", q.cfg.explain(err))
	}
	return nil
}

// originalPartition keeps a record's Partition while the topic has it,
// else balances by key as the Publisher does.
type originalPartition struct{}

// Balance implements kafka-go's Balancer.
func (originalPartition) Balance(m kafkago.Message, partitions ...int) int {
	if slices.Contains(partitions, m.Partition) {
		return m.Partition
	}
	return kafkago.Murmur2Balancer{}.Balance(m, partitions...)
}
