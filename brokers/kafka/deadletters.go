package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
)

// ErrDeadLettersFragmented is returned (wrapped) by Redrive and Purge when
// the records handled out of order on one partition of the dead-letter
// topic can no longer be recorded in the offset commit's metadata (see
// DeadLetters). Nothing more was removed: handle the oldest parked
// records of the partition (redrive or purge them) so that the handled
// ones join up behind the committed offset, then try again.
var ErrDeadLettersFragmented = errors.New("kafka: too many dead letters handled out of order")

// maxDeadLetterMetadata is the longest offset-commit metadata DeadLetters
// writes: the brokers' default offset.metadata.max.bytes.
const maxDeadLetterMetadata = 4096

// DeadLetters is the operator's handle on the dead letters one consumer
// group parked in its dead-letter topic (see admin.DeadLetterQueue): Scan
// lists them, Redrive produces them back to the topic they were consumed
// from, Purge drops them.
//
// Reading never consumes: each call reads every partition of the
// dead-letter topic with plain fetches, from the offset its bookkeeping
// group (WithDeadLetterGroup, default "<group>.dlq-operator") committed
// up to the high watermark taken when the call began, so a call
// terminates while consumers keep parking more. It holds one fetch (at
// most 1 MiB) of records at a time, plus the handled ranges.
//
// A Kafka topic cannot delete single records, so a redriven or purged
// record is recorded as handled in the bookkeeping group: its committed
// offset on a partition marks every record below it handled, and the
// handled records above it (handled out of order: the operator redrove a
// record but left an earlier one parked) are kept as ranges in the
// commit's metadata string. The committed offset advances over every run
// of handled records, other groups' records and gaps, so the metadata
// only grows with the records left parked between handled ones. When it
// would pass 4096 bytes (Kafka's default offset.metadata.max.bytes; a
// cluster with a lower limit refuses the commit the same way), Redrive
// and Purge stop with an error wrapping ErrDeadLettersFragmented; the
// operator then handles the oldest parked records of that partition
// first. Resetting the bookkeeping group's offsets (kafka-consumer-groups
// --reset-offsets) lists every retained dead letter again.
//
// Several groups consuming one topic share its default dead-letter topic:
// a DeadLetters works only on the records whose HeaderGroup is its group
// (and on records without one, which no idemq Source wrote) and leaves the
// others to their groups.
//
// Redrive produces each chosen record to its original topic and partition
// (HeaderOriginalTopic, HeaderOriginalPartition; by key when that
// partition is gone) with its key, value and headers minus idemq's
// bookkeeping ones (driver.CauseHeader, HeaderAttempt, HeaderGroup, the
// HeaderOriginal* ones, HeaderNotBefore), waits until every in-sync
// replica has it (RequireAll), and only then commits it as handled. Every
// consumer group of that topic receives the redriven record; the groups
// that had applied it decide it Duplicate while their claims exist.
//
// One DeadLetters per bookkeeping group should work at a time: two
// operators redriving the same group's dead letters at once may lose each
// other's bookkeeping, and records then come back to the list (redriving
// them again is harmless: consumers decide Duplicate). It is not safe for
// concurrent use.
type DeadLetters struct {
	cfg    config
	group  string // the bookkeeping group
	client *kafkago.Client
	writer *kafkago.Writer
}

var _ admin.DeadLetterQueue = (*DeadLetters)(nil)

// OpenDeadLetters opens the dead letters of the consumer group a Source
// with the same target and options consumes with: a kafka:// URL or a
// broker list with WithTopic and WithGroup, read exactly as Open reads
// them (WithDeadLetterTopic, WithDeadLetterGroup and the security options
// apply; the consumer options are checked and ignored). It checks that
// the brokers answer; a dead-letter topic that does not exist yet holds no
// dead letters.
func OpenDeadLetters(ctx context.Context, target string, opts ...Option) (*DeadLetters, error) {
	cfg, err := sourceConfig(target, opts)
	if err != nil {
		return nil, err
	}
	group := cfg.deadLetterGroup
	if group == "" {
		group = cfg.group + ".dlq-operator"
		if err := checkGroup(group); err != nil {
			return nil, optErr(cfg.name("WithDeadLetterGroup", "dead_letter_group"), "the default %v; name one", err)
		}
	}
	q := &DeadLetters{
		cfg:    cfg,
		group:  group,
		client: &kafkago.Client{Addr: kafkago.TCP(cfg.brokers...), Timeout: 10 * time.Second, Transport: transport(cfg.dialer)},
	}
	if _, err := q.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{cfg.deadLetterTopic}}); err != nil {
		q.closeTransports()
		return nil, fmt.Errorf("kafka: brokers %v: %w", cfg.brokers, cfg.explain(err))
	}
	return q, nil
}

func openDeadLettersURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (admin.DeadLetterQueue, error) {
	return OpenDeadLetters(ctx, u.String(), loggerOption(cfg))
}

// Name returns the dead-letter topic.
func (q *DeadLetters) Name() string { return q.cfg.deadLetterTopic }

// Group returns the bookkeeping group that records what was handled.
func (q *DeadLetters) Group() string { return q.group }

// Scan calls fn with each of the group's dead letters parked when it
// began, partition by partition, oldest first within a partition, and
// leaves them parked. Ref is "<partition>/<offset>" in the dead-letter
// topic, Origin "<topic>/<partition>/<offset>" where the message was
// consumed, ParkedAt the record's timestamp (DeadLetter stamps the copy
// when it parks it). An error from fn stops the scan and is returned.
func (q *DeadLetters) Scan(ctx context.Context, fn func(*admin.Parked) error) error {
	parts, err := q.load(ctx)
	if err != nil {
		return err
	}
	for _, p := range parts {
		if err := q.walk(ctx, p, func(l *letter) error { return fn(l.parked) }); err != nil {
			return err
		}
	}
	return nil
}

// Redrive produces each dead letter sel chooses back to the partition of
// the topic it was consumed from, without idemq's bookkeeping headers (so
// its attempt count starts again), and records it as handled once the
// write is acknowledged by every in-sync replica. See
// admin.DeadLetterQueue and DeadLetters.
func (q *DeadLetters) Redrive(ctx context.Context, sel func(*admin.Parked) bool, progress func(done int)) (int, error) {
	return q.handle(ctx, sel, progress, q.redrive)
}

// Purge records each dead letter sel chooses as handled, so that no later
// call lists it, and returns how many. The records stay in the topic until
// its retention removes them.
func (q *DeadLetters) Purge(ctx context.Context, sel func(*admin.Parked) bool) (int, error) {
	return q.handle(ctx, sel, nil, nil)
}

// Close releases the connections.
func (q *DeadLetters) Close() error {
	var err error
	if q.writer != nil {
		err = q.writer.Close()
	}
	q.closeTransports()
	return err
}

func (q *DeadLetters) closeTransports() {
	if q.writer != nil {
		q.writer.Transport.(*kafkago.Transport).CloseIdleConnections()
	}
	q.client.Transport.(*kafkago.Transport).CloseIdleConnections()
}

// dlqPart is one partition of the dead-letter topic as a call sees it.
type dlqPart struct {
	id        int
	committed int64  // the bookkeeping group's committed offset, -1 none
	handled   []span // handled records above committed, sorted, disjoint
	from, end int64  // the records the call reads: [from, end)
}

// letter is one of the group's dead letters read by a call.
type letter struct {
	offset  int64
	parked  *admin.Parked
	key     []byte
	value   []byte
	headers []kafkago.Header
}

// load reads the dead-letter topic's partitions, their offsets and the
// bookkeeping group's commits. A missing topic holds nothing.
func (q *DeadLetters) load(ctx context.Context) ([]*dlqPart, error) {
	topic := q.cfg.deadLetterTopic
	md, err := q.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("kafka: dead-letter topic %q: %w", topic, q.cfg.explain(err))
	}
	var parts []*dlqPart
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if errors.Is(t.Error, kafkago.UnknownTopicOrPartition) {
			return nil, nil
		} else if t.Error != nil {
			return nil, fmt.Errorf("kafka: dead-letter topic %q: %w", topic, t.Error)
		}
		for _, p := range t.Partitions {
			parts = append(parts, &dlqPart{id: p.ID, committed: -1})
		}
	}
	if len(parts) == 0 {
		return nil, nil
	}
	slices.SortFunc(parts, func(a, b *dlqPart) int { return a.id - b.id })
	lreq := &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{}}
	freq := &kafkago.OffsetFetchRequest{GroupID: q.group, Topics: map[string][]int{}}
	for _, p := range parts {
		lreq.Topics[topic] = append(lreq.Topics[topic], kafkago.FirstOffsetOf(p.id), kafkago.LastOffsetOf(p.id))
		freq.Topics[topic] = append(freq.Topics[topic], p.id)
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
	for _, p := range parts {
		for _, po := range lresp.Topics[topic] {
			if po.Partition != p.id {
				continue
			}
			if po.Error != nil {
				return nil, fmt.Errorf("kafka: dead-letter topic %q partition %d: listing offsets: %w", topic, p.id, po.Error)
			}
			p.from, p.end = po.FirstOffset, po.LastOffset
		}
		for _, fp := range fresp.Topics[topic] {
			if fp.Partition != p.id {
				continue
			}
			if fp.Error != nil {
				return nil, fmt.Errorf("kafka: dead-letter group %q partition %d: %w", q.group, p.id, fp.Error)
			}
			if fp.CommittedOffset < 0 || fp.CommittedOffset > p.end {
				// None, or one past the end: the topic was deleted and
				// created again, and its records are all new.
				continue
			}
			_, spans, err := decodeProgress(fp.CommittedOffset, fp.Metadata)
			if err != nil {
				return nil, fmt.Errorf("kafka: dead-letter group %q partition %d: unreadable commit metadata: %w", q.group, p.id, err)
			}
			p.committed, p.handled = fp.CommittedOffset, spans
			p.from = max(p.from, fp.CommittedOffset)
		}
	}
	return parts, nil
}

// walk calls fn with each of the group's dead letters of p that is not
// handled, in offset order, reading [p.from, p.end).
func (q *DeadLetters) walk(ctx context.Context, p *dlqPart, fn func(*letter) error) error {
	topic := q.cfg.deadLetterTopic
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
		for {
			r, err := resp.Records.ReadRecord()
			if err != nil {
				break
			}
			if r.Offset < offset || r.Offset >= p.end {
				continue
			}
			offset, read = r.Offset+1, true
			if covered(p.handled, r.Offset) {
				continue
			}
			l, err := q.letter(p.id, r)
			if err != nil {
				return err
			}
			if l != nil {
				batch = append(batch, l)
			}
		}
		for _, l := range batch {
			if err := fn(l); err != nil {
				return err
			}
		}
		if !read {
			break // nothing readable is left below the high watermark
		}
	}
	return nil
}

// letter converts a record of partition into a dead letter, nil when
// another group parked it.
func (q *DeadLetters) letter(partition int, r *kafkago.Record) (*letter, error) {
	l := &letter{offset: r.Offset, headers: r.Headers}
	var err error
	if r.Key != nil {
		if l.key, err = io.ReadAll(r.Key); err != nil {
			return nil, fmt.Errorf("kafka: dead-letter topic %q: reading record %d/%d: %w", q.cfg.deadLetterTopic, partition, r.Offset, err)
		}
	}
	if r.Value != nil {
		if l.value, err = io.ReadAll(r.Value); err != nil {
			return nil, fmt.Errorf("kafka: dead-letter topic %q: reading record %d/%d: %w", q.cfg.deadLetterTopic, partition, r.Offset, err)
		}
	}
	h := make(map[string]string, len(r.Headers))
	for _, kh := range r.Headers {
		h[kh.Key] = string(kh.Value) // the last of repeated keys wins, as in toMessage
	}
	if g, ok := h[HeaderGroup]; ok && g != q.cfg.group {
		return nil, nil
	}
	attempt, _ := strconv.Atoi(h[HeaderAttempt])
	dest := h[HeaderOriginalTopic]
	if dest == "" {
		dest = q.cfg.topic
	}
	origin := ""
	if t := h[HeaderOriginalTopic]; t != "" {
		origin = t + "/" + h[HeaderOriginalPartition] + "/" + h[HeaderOriginalOffset]
	}
	l.parked = &admin.Parked{
		Ref:         strconv.Itoa(partition) + "/" + strconv.FormatInt(r.Offset, 10),
		ID:          h[q.cfg.idHeader],
		Cause:       h[driver.CauseHeader],
		Attempt:     attempt,
		Origin:      origin,
		Destination: dest,
		ParkedAt:    r.Time,
		Key:         string(l.key),
		Headers:     h,
		Body:        l.value,
	}
	return l, nil
}

// handle runs Redrive (do is redrive) or Purge (do is nil): each chosen
// dead letter is done, then committed as handled.
func (q *DeadLetters) handle(ctx context.Context, sel func(*admin.Parked) bool, progress func(int), do func(context.Context, *letter) error) (int, error) {
	parts, err := q.load(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range parts {
		kept := int64(-1) // the first dead letter of p left parked
		err := q.walk(ctx, p, func(l *letter) error {
			if sel != nil && !sel(l.parked) {
				if kept < 0 {
					kept = l.offset
				}
				return nil
			}
			point := l.offset + 1
			if kept >= 0 {
				point = kept
			}
			r, err := q.plan(p, point, l.offset)
			if err != nil {
				return err
			}
			if do != nil {
				if err := do(ctx, l); err != nil {
					return err
				}
			}
			if err := q.commit(ctx, p, r); err != nil {
				return err
			}
			n++
			if progress != nil {
				progress(n)
			}
			return nil
		})
		if err != nil {
			return n, err
		}
		// Pass the other groups' records and gaps up to the first parked one.
		point := p.end
		if kept >= 0 {
			point = kept
		}
		if point > p.committed && point > p.from {
			r, err := q.plan(p, point, -1)
			if err == nil {
				err = q.commit(ctx, p, r)
			}
			if err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// bookmark is what one offset commit writes for a partition.
type bookmark struct {
	point   int64
	handled []span // above point
	md      string
}

// plan works out the commit of point for p with the handled records above
// it, done (if not -1) among them, before anything is done: a commit that
// cannot be written fails here.
func (q *DeadLetters) plan(p *dlqPart, point, done int64) (bookmark, error) {
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
		return bookmark{}, fmt.Errorf("%w on partition %d of %q: their ranges above offset %d need more than %d bytes of commit metadata; redrive or purge the oldest ones first", ErrDeadLettersFragmented, p.id, q.cfg.deadLetterTopic, point, maxDeadLetterMetadata)
	}
	return bookmark{point: point, handled: dropBelow(handled, point), md: md}, nil
}

// commit writes r for p in the bookkeeping group.
func (q *DeadLetters) commit(ctx context.Context, p *dlqPart, r bookmark) error {
	resp, err := q.client.OffsetCommit(ctx, &kafkago.OffsetCommitRequest{
		GroupID:      q.group,
		GenerationID: -1, // a group without members: Kafka takes the commit as it is
		Topics:       map[string][]kafkago.OffsetCommit{q.cfg.deadLetterTopic: {{Partition: p.id, Offset: r.point, Metadata: r.md}}},
	})
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
		return fmt.Errorf("kafka: dead-letter group %q: recording partition %d up to offset %d as handled: %w", q.group, p.id, r.point, err)
	}
	p.committed, p.handled = r.point, r.handled
	return nil
}

// redrive produces l back where it was consumed and waits for every
// in-sync replica.
func (q *DeadLetters) redrive(ctx context.Context, l *letter) error {
	if q.writer == nil {
		q.writer = &kafkago.Writer{
			Addr:         kafkago.TCP(q.cfg.brokers...),
			Balancer:     originalPartition{},
			RequiredAcks: kafkago.RequireAll,
			BatchTimeout: q.cfg.batchTimeout,
			Transport:    transport(q.cfg.dialer),
			ErrorLogger:  kafkaLogger{q.log()},
		}
	}
	m := kafkago.Message{Topic: l.parked.Destination, Key: l.key, Value: l.value, Partition: -1}
	for _, h := range l.headers {
		switch h.Key {
		case driver.CauseHeader, HeaderAttempt, HeaderGroup:
		case HeaderOriginalPartition:
			if n, err := strconv.Atoi(string(h.Value)); err == nil {
				m.Partition = n
			}
		default:
			if !isCoordinate(h.Key) {
				m.Headers = append(m.Headers, h)
			}
		}
	}
	if err := q.writer.WriteMessages(ctx, m); err != nil {
		return fmt.Errorf("kafka: redriving %s (%s) to %q: %w", l.parked.Ref, l.parked.ID, m.Topic, q.cfg.explain(err))
	}
	return nil
}

// originalPartition puts a redriven record on the partition in its
// Partition field (where it was consumed) while the topic has it, and
// otherwise where the Publisher puts its key.
type originalPartition struct{}

// Balance implements kafka-go's Balancer.
func (originalPartition) Balance(m kafkago.Message, partitions ...int) int {
	if slices.Contains(partitions, m.Partition) {
		return m.Partition
	}
	return kafkago.Murmur2Balancer{}.Balance(m, partitions...)
}

// log is the logger of WithLogger, or slog.Default().
func (q *DeadLetters) log() *slog.Logger {
	if q.cfg.logger != nil {
		return q.cfg.logger
	}
	return slog.Default()
}

// addSpan adds offset to spans (sorted, disjoint), merging neighbours.
func addSpan(spans []span, offset int64) []span {
	i, _ := slices.BinarySearchFunc(spans, offset, func(s span, o int64) int {
		switch {
		case s.end() <= o:
			return -1
		case s.start > o:
			return 1
		}
		return 0
	})
	out := slices.Clone(spans)
	if i < len(out) && out[i].start <= offset {
		return out // already in
	}
	out = slices.Insert(out, i, span{offset, 1})
	if i+1 < len(out) && out[i].end() == out[i+1].start {
		out[i].count += out[i+1].count
		out = slices.Delete(out, i+1, i+2)
	}
	if i > 0 && out[i-1].end() == out[i].start {
		out[i-1].count += out[i].count
		out = slices.Delete(out, i, i+1)
	}
	return out
}
