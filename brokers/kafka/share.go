package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemq/idemq/core/driver"
)

// ShareSource consumes one topic as a member of a Kafka share group
// (KIP-932, "queues for Kafka"): many members read one partition, the
// broker locks each record it hands out (group.share.record.lock.duration.ms)
// and takes an acknowledgement per record. Ack is ACCEPT; Retry is RELEASE
// once the Consumer waited out the delay (the record stays locked to this
// member meanwhile, as long as its lock lasts); DeadLetter produces a copy
// to the dead-letter topic with the bookkeeping headers, then REJECTs (or
// RELEASEs, when the copy failed); Release, and Abandon of a record whose
// lock lapsed while held, are RELEASE; Extend renews locks (RENEW, Kafka
// 4.2). franz-go accepts, at each poll, every record of the previous poll
// left unacknowledged: a ShareSource polls again only once every record of
// its last poll is marked. Attempt is the broker's delivery count. It is a
// driver.Puller, Extender, Releaser, Abandoner, DeliveryLimiter and
// DeliveryLimitHinter, safe for concurrent use.
type ShareSource struct {
	base
	lock  time.Duration
	limit int
	life  context.Context // cancelled by Close
	stop  context.CancelFunc
	poll  sync.Mutex // held by the one Receive that polls or waits
	shut  sync.Once  // Close's work, done once

	mu     sync.Mutex
	member *kgo.Client // joined at Start
	window int
	out    int // records of the last poll not yet marked
	room   chan struct{}
	buf    []*shareRecord // polled, not yet returned by Receive
	closed bool
}

var (
	_ driver.Puller              = (*ShareSource)(nil)
	_ driver.Extender            = (*ShareSource)(nil)
	_ driver.Releaser            = (*ShareSource)(nil)
	_ driver.Abandoner           = (*ShareSource)(nil)
	_ driver.DeliveryLimiter     = (*ShareSource)(nil)
	_ driver.DeliveryLimitHinter = (*ShareSource)(nil)
)

// shareRecord is one polled record and its Message; it is the Message's
// AckID.
type shareRecord struct {
	s      *ShareSource
	r      *kgo.Record
	m      driver.Message
	marked bool // its acknowledgement is given; under s.mu
}

// OpenShare opens a ShareSource for a kafka+share:// URL (see the package
// documentation), or a broker list with WithTopic and WithGroup, applying
// opts after the URL's parameters. It reads the share group's record lock
// and delivery-count limit from the brokers, and sets the group's
// share.auto.offset.reset as WithStart says. The group is joined at Start.
func OpenShare(ctx context.Context, addr string, opts ...Option) (*ShareSource, error) {
	s := &ShareSource{}
	s.life, s.stop = context.WithCancel(context.Background())
	if err := s.open(ctx, addr, opts, ShareScheme); err != nil {
		return nil, err
	}
	var err error
	if s.lock, s.limit, err = groupSettings(ctx, s.cl, s.cfg.group); err == nil {
		err = setStart(ctx, s.cl, s.cfg.group, s.cfg.start)
	}
	if err != nil {
		s.cl.Close()
		return nil, fmt.Errorf("kafka+share: share group %s: %w", s.cfg.group, s.cfg.explain(err))
	}
	return s, nil
}

// RecordLock returns the share group's acquisition lock: how long the
// broker lets a record wait for its acknowledgement or a renewal.
func (s *ShareSource) RecordLock() time.Duration { return s.lock }

// DeliveryLimit implements driver.DeliveryLimiter: the share group's
// delivery-count limit, after which the broker archives a record.
func (s *ShareSource) DeliveryLimit(context.Context) (int, bool) { return s.limit, s.limit > 0 }

// DeliveryLimitHint implements driver.DeliveryLimitHinter.
func (s *ShareSource) DeliveryLimitHint(maxAttempts int) string {
	return fmt.Sprintf("set share.delivery.count.limit=%d on share group %s (kafka-configs --entity-type groups), or group.share.delivery.count.limit on the brokers", maxAttempts, s.cfg.group)
}

// Start implements driver.Source: it joins the share group, acquiring at
// most a window of records a poll. A record's lease is its lock less a
// tenth (the broker starts the lock before the record reaches this
// process), renewed up to WithMaxExtension.
func (s *ShareSource) Start(_ context.Context, st driver.Setup) (driver.Traits, error) {
	s.adopt(st)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.member != nil || s.closed {
		return driver.Traits{}, errors.New("kafka+share: Start: the source was started or closed before")
	}
	member, err := kgo.NewClient(append(s.cfg.kgoOpts(s.log), kgo.ConsumeTopics(s.cfg.topic), kgo.ShareGroup(s.cfg.group),
		// No more than a window acquired at a time: a record waiting in
		// franz-go's buffer would spend its lock there.
		kgo.ShareMaxRecords(int32(st.Window)), kgo.ShareMaxRecordsStrict(), kgo.ShareAckCallback(s.acked))...)
	if err != nil {
		return driver.Traits{}, fmt.Errorf("kafka+share: %w", err)
	}
	s.member, s.window = member, st.Window
	return driver.Traits{Lease: s.lock * 9 / 10, MaxExtension: s.cfg.maxExtension}, nil
}

// Receive implements driver.Puller: it returns up to max records of the
// last poll, and polls again only once every record of that poll is
// marked.
func (s *ShareSource) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	s.poll.Lock()
	defer s.poll.Unlock()
	for {
		s.mu.Lock()
		if s.closed || s.member == nil {
			s.mu.Unlock()
			return nil, driver.ErrSourceClosed
		}
		if n := min(max, len(s.buf)); n > 0 {
			ms := make([]*driver.Message, n)
			for i, rec := range s.buf[:n] {
				ms[i] = &rec.m
			}
			s.buf = s.buf[n:]
			s.mu.Unlock()
			return ms, nil
		}
		out, room, member := s.out, s.room, s.member
		s.mu.Unlock()
		if out > 0 {
			select {
			case <-room:
			case <-s.life.Done():
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		}
		if err := s.fetch(ctx, member); err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// fetch polls a window of records into the buffer.
func (s *ShareSource) fetch(ctx context.Context, member *kgo.Client) error {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.life, cancel)()
	fs := member.PollRecords(pctx, s.window)
	var errs []error
	fs.EachError(func(topic string, partition int32, err error) {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, kgo.ErrClientClosed) {
			errs = append(errs, fmt.Errorf("kafka+share: polling %s[%d] in share group %s: %w", topic, partition, s.cfg.group, s.cfg.explain(err)))
		}
	})
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	fs.EachRecord(func(r *kgo.Record) {
		rec := &shareRecord{s: s, r: r}
		readRecord(r, &s.cfg, &rec.m)
		rec.m.Attempt, rec.m.ReceivedAt, rec.m.AckID, rec.m.Metadata = max(int(r.DeliveryCount()), 1), now, rec, (*shareMetadata)(rec)
		if s.out++; s.room == nil {
			s.room = make(chan struct{})
		}
		if s.buf = append(s.buf, rec); s.closed {
			s.markLocked(rec, kgo.AckRelease)
		}
	})
	return errors.Join(errs...)
}

// markLocked gives rec its acknowledgement, once. s.mu is held.
func (s *ShareSource) markLocked(rec *shareRecord, status kgo.AckStatus) {
	if rec.marked {
		return
	}
	rec.marked = true
	rec.r.Ack(status)
	if s.out--; s.out == 0 && s.room != nil {
		close(s.room)
		s.room = nil
	}
}

// recordOf returns m's record, when this source polled it and it can still
// be settled.
func (s *ShareSource) recordOf(m *driver.Message) (*shareRecord, error) {
	rec, ok := m.AckID.(*shareRecord)
	switch {
	case !ok || rec.s != s:
		return nil, fmt.Errorf("kafka+share: message %q was not received from this source", m.ID)
	case s.closed:
		return nil, driver.Stale(errClosed)
	case rec.marked: // released when its lock lapsed
		return nil, driver.Stale(fmt.Errorf("kafka+share: record %s was released", recordOrigin(rec.r)))
	}
	return rec, nil
}

// mark gives each of ms its status (status(i), nil: none) and flushes the
// acknowledgements; errs holds the errors found before.
func (s *ShareSource) mark(ctx context.Context, ms []*driver.Message, errs []error, status func(i int) kgo.AckStatus) error {
	s.mu.Lock()
	member := s.member
	for i, m := range ms {
		rec, err := s.recordOf(m)
		switch {
		case errs[i] != nil:
		case err != nil:
			errs[i] = err
		default:
			s.markLocked(rec, status(i))
		}
	}
	s.mu.Unlock()
	if err := member.FlushAcks(ctx); err != nil {
		return fmt.Errorf("kafka+share: flushing acknowledgements of %s: %w", s.cfg.topic, err)
	}
	return driver.PartialOf(errs)
}

func (s *ShareSource) markAll(ctx context.Context, ms []*driver.Message, status kgo.AckStatus) error {
	return s.mark(ctx, ms, make([]error, len(ms)), func(int) kgo.AckStatus { return status })
}

// Ack implements driver.Source with ACCEPT.
func (s *ShareSource) Ack(ctx context.Context, ms []*driver.Message) error {
	return s.markAll(ctx, ms, kgo.AckAccept)
}

// Retry implements driver.Source with RELEASE: the broker delivers the
// records again, counting the delivery.
func (s *ShareSource) Retry(ctx context.Context, ms []*driver.Message, _ time.Duration) error {
	return s.markAll(ctx, ms, kgo.AckRelease)
}

// Release implements driver.Releaser with RELEASE.
func (s *ShareSource) Release(ctx context.Context, ms []*driver.Message) error {
	return s.markAll(ctx, ms, kgo.AckRelease)
}

// Abandon implements driver.Abandoner: records whose lock lapsed are
// released, so that the next poll does not accept them; the broker refuses
// the release once the lock is gone, and delivers them again.
func (s *ShareSource) Abandon(ctx context.Context, ms []*driver.Message) {
	if err := s.markAll(ctx, ms, kgo.AckRelease); err != nil {
		s.log().Debug("idemq kafka+share: releasing records whose lock lapsed", "error", err)
	}
}

// Extend implements driver.Extender with RENEW.
func (s *ShareSource) Extend(ctx context.Context, ms []*driver.Message) error {
	s.mu.Lock()
	member := s.member
	for _, m := range ms {
		if rec, err := s.recordOf(m); err == nil {
			rec.r.Ack(kgo.AckRenew)
		}
	}
	s.mu.Unlock()
	if err := member.FlushAcks(ctx); err != nil {
		return fmt.Errorf("kafka+share: renewing record locks of %s: %w", s.cfg.topic, err)
	}
	return nil
}

// DeadLetter implements driver.Source: a copy of each record, with the
// cause and the other bookkeeping headers, is produced to the dead-letter
// topic, then the record is rejected (the broker archives it). A record
// whose copy failed is released, never rejected.
func (s *ShareSource) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	var recs []*kgo.Record
	var idx []int
	s.mu.Lock()
	for i, m := range ms {
		if rec, err := s.recordOf(m); err == nil {
			h, at := deadLetterHeaders(causes[i], m.Attempt, recordOrigin(rec.r), s.cfg.group)
			recs, idx = append(recs, copyRecord(rec.r, s.cfg.deadLetterTopic, h, at)), append(idx, i)
		}
	}
	s.mu.Unlock()
	status, copyErrs := make([]kgo.AckStatus, len(ms)), make([]error, len(ms))
	for k, r := range s.cl.ProduceSync(ctx, recs...) {
		i := idx[k]
		if status[i] = kgo.AckReject; r.Err != nil {
			status[i] = kgo.AckRelease
			copyErrs[i] = fmt.Errorf("kafka+share: dead-lettering record %s to %s (released for redelivery): %w", recordOrigin(r.Record), s.cfg.deadLetterTopic, s.cfg.explain(r.Err))
		}
	}
	errs := make([]error, len(ms))
	if err := s.mark(ctx, ms, errs, func(i int) kgo.AckStatus { return status[i] }); err != nil && !errors.As(err, new(*driver.Partial)) {
		return err
	}
	for i, err := range copyErrs {
		errs[i] = cmp.Or(errs[i], err)
	}
	return driver.PartialOf(errs)
}

// acked is franz-go's ShareAckCallback. The broker refuses the
// acknowledgement of a record whose lock passed (the Consumer reckons that
// lapse itself, and reports the settlement stale); the record comes back
// and is decided again.
func (s *ShareSource) acked(_ *kgo.Client, rs kgo.ShareAckResults) {
	for _, r := range rs {
		if r.Err != nil {
			s.log().Info("idemq kafka+share: the broker refused acknowledgements; it delivers their records again", "topic", r.Topic, "partition", r.Partition, "error", r.Err)
		}
	}
}

// Close implements driver.Source: it leaves the share group, which
// releases every record not yet settled (those buffered first); settling
// one afterwards returns a stale error.
func (s *ShareSource) Close() error {
	s.shut.Do(func() {
		s.mu.Lock()
		s.closed = true
		for _, rec := range s.buf {
			s.markLocked(rec, kgo.AckRelease)
		}
		s.buf = nil
		s.stop()
		member := s.member
		s.mu.Unlock()
		s.poll.Lock() // waits for a poll under way
		s.poll.Unlock()
		if member != nil {
			member.Close()
		}
		s.cl.Close()
	})
	return nil
}

// shareMetadata is a polled record's Message.Metadata, read from it when
// asked.
type shareMetadata shareRecord

// All yields the topic, share group, partition, offset and delivery count.
func (m *shareMetadata) All() iter.Seq2[string, slog.Value] {
	return func(yield func(string, slog.Value) bool) {
		_ = yield("messaging.destination.name", slog.StringValue(m.r.Topic)) &&
			yield("messaging.consumer.group.name", slog.StringValue(m.s.cfg.group)) &&
			yield("messaging.destination.partition.id", slog.StringValue(strconv.Itoa(int(m.r.Partition)))) &&
			yield("messaging.kafka.offset", slog.Int64Value(m.r.Offset)) &&
			yield("messaging.kafka.delivery_count", slog.Int64Value(int64(m.r.DeliveryCount())))
	}
}

// Kafka's defaults for share groups, used where a broker does not say.
const (
	defaultLock  = 30 * time.Second
	defaultLimit = 5
)

// groupSettings reads the group's record lock and delivery-count limit:
// the group's own config (share.record.lock.duration.ms,
// share.delivery.count.limit) where set, else the brokers' defaults for
// share groups (group.share.record.lock.duration.ms,
// group.share.delivery.count.limit), else Kafka's.
func groupSettings(ctx context.Context, cl *kgo.Client, group string) (time.Duration, int, error) {
	meta, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		return 0, 0, fmt.Errorf("reading the cluster's metadata: %w", err)
	}
	if len(meta.Brokers) == 0 {
		return 0, 0, errors.New("the cluster named no broker")
	}
	lockMs, limit := int(defaultLock/time.Millisecond), defaultLimit
	broker, err := describe(ctx, cl, kmsg.ConfigResourceTypeBroker, strconv.Itoa(int(meta.Brokers[0].NodeID)), false)
	if err != nil {
		return 0, 0, err
	}
	readInt(broker, "group.share.record.lock.duration.ms", &lockMs)
	readInt(broker, "group.share.delivery.count.limit", &limit)
	// A broker older than group configs refuses the resource type: its
	// defaults are the group's.
	if own, err := describe(ctx, cl, kmsg.ConfigResourceTypeGroupConfig, group, true); err == nil {
		readInt(own, "share.record.lock.duration.ms", &lockMs)
		readInt(own, "share.delivery.count.limit", &limit)
	}
	if lockMs < 100 {
		return 0, 0, fmt.Errorf("record lock of %d ms: too short to renew", lockMs)
	}
	return time.Duration(lockMs) * time.Millisecond, limit, nil
}

// describe returns the configs of one resource; onlySet keeps those set on
// the resource itself.
func describe(ctx context.Context, cl *kgo.Client, typ kmsg.ConfigResourceType, name string, onlySet bool) (map[string]string, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	rr := kmsg.NewDescribeConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = typ, name
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) != 1 {
		err = fmt.Errorf("%d resources in the answer", len(resp.Resources))
	}
	if err == nil {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		return nil, fmt.Errorf("describing the configs of %s %q: %w", typ, name, err)
	}
	out := map[string]string{}
	for _, c := range resp.Resources[0].Configs {
		if c.Value != nil && (!onlySet || c.Source == kmsg.ConfigSourceGroupConfig) {
			out[c.Name] = *c.Value
		}
	}
	return out, nil
}

// readInt sets *dst to cfg[name] when that is a positive integer.
func readInt(cfg map[string]string, name string, dst *int) {
	if n, err := strconv.Atoi(cfg[name]); err == nil && n > 0 {
		*dst = n
	}
}

// setStart sets the group's share.auto.offset.reset as start says.
func setStart(ctx context.Context, cl *kgo.Client, group string, start Start) error {
	if start == StartAsIs {
		return nil
	}
	value := map[Start]string{StartFirst: "earliest", StartLast: "latest"}[start]
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	rr := kmsg.NewIncrementalAlterConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Op, c.Value = "share.auto.offset.reset", kmsg.IncrementalAlterConfigOpSet, &value
	rr.Configs = append(rr.Configs, c)
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) == 1 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("setting share.auto.offset.reset=%s (WithStart; start=as-is leaves it): %w", value, err)
	}
	return nil
}
