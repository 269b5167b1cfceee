package kafkashare

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/unsettled"
)

// Scheme is the URL scheme of a share-group Source.
const Scheme = "kafka+share"

// HeaderGroup is the record header of a dead-lettered copy naming the
// share group that parked it, as the kafka:// adapter writes it.
const HeaderGroup = "idemq-group"

// key names one acquired record of the topic.
type key struct {
	partition int32
	offset    int64
}

type entry = unsettled.Entry[key, *received]

// Source consumes one topic as a member of a Kafka share group (KIP-932).
// It implements driver's Source, BatchSettler, WindowSetter, LoggerSetter,
// DeliveryLimiter and DeliveryLimitHinter. Receive may be called from
// several goroutines.
type Source struct {
	c      config
	admin  *kgo.Client // configs and dead-letter copies
	lock   time.Duration
	limit  int
	set    *unsettled.Set[key, *received]
	log    unsettled.Logger
	delays unsettled.Delays
	fetch  sync.Mutex // held while polling
	room   unsettled.Room
	done   chan struct{} // closed by Close
	stopHB context.CancelFunc
	hb     sync.WaitGroup

	mu sync.Mutex
	// member is the share-group client, joined at the first Receive.
	// franz-go accepts, at a poll, every record of the previous poll left
	// without an acknowledgement, so it polls again only once out, the
	// records of its last poll not yet marked, is back to 0.
	member *kgo.Client
	out    int
	buf    []*entry // polled, not yet handed out
	window int
	closed bool
}

// Open opens a Source for the kafka+share:// URL raw (see the package
// documentation), applying opts after its parameters. It reads the
// share group's record lock and delivery-count limit from the brokers, and
// sets the group's share.auto.offset.reset as WithStart says. The group is
// joined at the first Receive.
func Open(ctx context.Context, raw string, opts ...Option) (*Source, error) {
	c, err := resolve(raw, opts)
	if err != nil {
		return nil, err
	}
	admin, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.brokers...)}, c.kgoOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafkashare: %w", err)
	}
	s := &Source{c: c, admin: admin, window: c.window, room: unsettled.NewRoom(), done: make(chan struct{})}
	s.log.Init(c.logger)
	if s.lock, s.limit, err = groupSettings(ctx, admin, c.group); err == nil {
		err = setStart(ctx, admin, c.group, c.start)
	}
	if err != nil {
		admin.Close()
		return nil, fmt.Errorf("kafkashare: share group %s: %w", c.group, err)
	}
	// A tenth short of the lock: the broker starts it before the records
	// reach this process.
	s.set = unsettled.New[key, *received](s.lock*9/10, c.maxExtension)
	hb, stop := context.WithCancel(context.Background())
	s.stopHB = stop
	s.hb.Go(func() { unsettled.Heartbeat(hb, s.lock/4, s.beat) })
	return s, nil
}

// SetLogger implements driver.LoggerSetter.
func (s *Source) SetLogger(l *slog.Logger) { s.log.SetLogger(l) }

// SetWindow implements driver.WindowSetter: a poll acquires at most n
// records.
func (s *Source) SetWindow(n int) error {
	if n < 1 {
		return fmt.Errorf("kafkashare: window %d must be positive", n)
	}
	s.mu.Lock()
	s.window = n
	s.mu.Unlock()
	return nil
}

// DeliveryLimit implements driver.DeliveryLimiter: the share group's
// delivery-count limit, after which the broker archives a record.
func (s *Source) DeliveryLimit(context.Context) (int, bool) { return s.limit, s.limit > 0 }

// DeliveryLimitHint implements driver.DeliveryLimitHinter.
func (s *Source) DeliveryLimitHint(maxAttempts int) string {
	return fmt.Sprintf("set share.delivery.count.limit=%d on share group %s (kafka-configs --entity-type groups), or group.share.delivery.count.limit on the brokers", maxAttempts, s.c.group)
}

// RecordLock returns the share group's acquisition lock: how long the
// broker lets a record wait for its acknowledgement or a renewal.
func (s *Source) RecordLock() time.Duration { return s.lock }

// Receive implements driver.Source. The records of one poll are all
// settled before the next poll: franz-go accepts, at a poll, every record
// of the previous one left without an acknowledgement.
func (s *Source) Receive(ctx context.Context) (driver.Delivery, error) {
	return unsettled.Serial(ctx, &s.fetch, s.next)
}

// next hands out a polled record, or polls; nil, nil: nothing yet.
func (s *Source) next(ctx context.Context) (driver.Delivery, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, driver.ErrSourceClosed
	}
	if len(s.buf) > 0 {
		e := s.buf[0]
		s.buf = s.buf[1:]
		s.mu.Unlock()
		return &delivery{s, e}, nil
	}
	s.mu.Unlock()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	now := time.Now()
	for _, e := range s.set.All() {
		if !s.set.Lapses(e).After(now) {
			// Its lock is gone as far as this process can tell; were it
			// not, the member's next poll would accept a record still
			// undecided.
			s.set.Drop(e, unsettled.ErrLeaseLapsed)
			s.mark(e.D, kgo.AckRelease)
		}
	}
	cl, err := s.join()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	out, window := s.out, s.window
	s.mu.Unlock()
	if out > 0 {
		select {
		case <-s.room.Wait():
		case <-s.done:
		case <-ctx.Done():
		case <-time.After(s.lock / 10):
		}
		return nil, nil
	}
	return nil, s.poll(ctx, cl, window)
}

// join returns the share-group client, joining the group the first time.
func (s *Source) join() (*kgo.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.member != nil {
		return s.member, nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(s.c.brokers...),
		kgo.ConsumeTopics(s.c.topic),
		kgo.ShareGroup(s.c.group),
		// No more than a window acquired at a time: a record waiting in
		// franz-go's buffer would spend its lock there.
		kgo.ShareMaxRecords(int32(s.window)),
		kgo.ShareMaxRecordsStrict(),
		kgo.ShareAckCallback(s.acked),
	}, s.c.kgoOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafkashare: %w", err)
	}
	s.member = cl
	return cl, nil
}

// mark gives r its acknowledgement, once, and counts it off the poll's.
func (s *Source) mark(r *received, status kgo.AckStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.marked {
		return
	}
	r.marked = true
	r.r.Ack(status)
	s.out--
	s.room.Made()
}

// poll acquires up to n records with cl into the buffer.
func (s *Source) poll(ctx context.Context, cl *kgo.Client, n int) error {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-pctx.Done():
		}
	}()
	fs := cl.PollRecords(pctx, n)
	var errs []error
	fs.EachError(func(topic string, partition int32, err error) {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, kgo.ErrClientClosed) {
			errs = append(errs, fmt.Errorf("kafkashare: polling %s[%d] in share group %s: %w", topic, partition, s.c.group, err))
		}
	})
	now := time.Now()
	fs.EachRecord(func(r *kgo.Record) {
		rec := s.message(r, now)
		s.mu.Lock()
		s.out++
		e := s.set.Add(key{r.Partition, r.Offset}, rec)
		if e != nil {
			s.buf = append(s.buf, e)
		}
		s.mu.Unlock()
		if e == nil {
			s.mark(rec, kgo.AckRelease) // closed meanwhile: give it back
		}
	})
	return errors.Join(errs...)
}

// received is a polled record's Message and what its Metadata reads.
type received struct {
	driver.Message
	s      *Source
	r      *kgo.Record
	marked bool // under s.mu
}

// message makes r's Message: its id from the id header, else (with
// WithOffsetID) topic/partition/offset.
func (s *Source) message(r *kgo.Record, now time.Time) *received {
	m := &received{s: s, r: r}
	m.Headers = make(map[string]string, len(r.Headers))
	for _, h := range r.Headers {
		m.Headers[h.Key] = string(h.Value)
	}
	m.ID = m.Headers[s.c.idHeader]
	if m.ID == "" && s.c.offsetID {
		m.ID = origin(r)
	}
	m.Body, m.Key, m.Source, m.System = r.Value, string(r.Key), r.Topic, "kafka"
	m.Attempt, m.ReceivedAt = max(int(r.DeliveryCount()), 1), now
	m.Metadata = (*metadata)(m)
	return m
}

// origin names r as topic/partition/offset.
func origin(r *kgo.Record) string {
	return r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
}

// metadata is a received record's Message.Metadata, read from it when
// asked.
type metadata received

// All yields the topic, share group, partition, offset and delivery count.
func (m *metadata) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		_ = yield("messaging.destination.name", m.r.Topic) &&
			yield("messaging.consumer.group.name", m.s.c.group) &&
			yield("messaging.destination.partition.id", strconv.Itoa(int(m.r.Partition))) &&
			yield("messaging.kafka.offset", strconv.FormatInt(m.r.Offset, 10)) &&
			yield("messaging.kafka.delivery_count", strconv.Itoa(int(m.r.DeliveryCount())))
	}
}

// acked is franz-go's ShareAckCallback. The broker refuses the
// acknowledgement of a record whose lock passed (the Source reckons that
// lapse itself, and reports the settlement stale); the record comes back
// and is decided again.
func (s *Source) acked(_ *kgo.Client, rs kgo.ShareAckResults) {
	for _, r := range rs {
		if r.Err != nil {
			s.log.Log().Info("idemq kafkashare: the broker refused acknowledgements; it delivers their records again", "topic", r.Topic, "partition", r.Partition, "error", r.Err)
		}
	}
}

// flush sends the acknowledgements marked so far.
func (s *Source) flush(ctx context.Context) error {
	s.mu.Lock()
	cl := s.member
	s.mu.Unlock()
	if cl == nil {
		return nil
	}
	if err := cl.FlushAcks(ctx); err != nil {
		return fmt.Errorf("kafkashare: flushing acknowledgements of %s: %w", s.c.topic, err)
	}
	return nil
}

// beat renews the locks of records still being decided, up to
// WithMaxExtension.
func (s *Source) beat(now time.Time) {
	due, sent := s.set.Due(now, s.lock/2), time.Now()
	if len(due) == 0 {
		return
	}
	for _, e := range due {
		e.D.r.Ack(kgo.AckRenew) // a no-op once the record is marked
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.lock/4)
	defer cancel()
	if err := s.flush(ctx); err != nil {
		s.log.Log().Warn("idemq kafkashare: renewing record locks failed; trying again next beat", "topic", s.c.topic, "records", len(due), "error", err)
		return
	}
	s.set.Extended(due, sent)
}

// Close implements driver.Source: it leaves the share group, which
// releases every record not yet settled; settling one afterwards returns
// a stale error.
func (s *Source) Close() error {
	s.mu.Lock()
	closed := s.closed
	s.closed, s.buf = true, nil
	s.mu.Unlock()
	if closed {
		return nil
	}
	close(s.done)
	s.fetch.Lock() // waits for a poll under way
	s.fetch.Unlock()
	s.stopHB()
	s.hb.Wait()
	s.delays.Stop() // retries still waiting are released by the leave
	s.set.Close()
	s.mu.Lock()
	cl := s.member
	s.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
	s.admin.Close()
	return nil
}

// AckBatch implements driver.BatchSettler: the records are accepted, and
// the acknowledgements flushed once.
func (s *Source) AckBatch(ctx context.Context, ds []driver.Delivery) error {
	own, errs := unsettled.Take("kafkashare", ds, func(d *delivery) bool { return d.s == s }, (*delivery).claim)
	if len(own) == 0 {
		return errors.Join(errs...)
	}
	for _, d := range own {
		s.mark(d.e.D, kgo.AckAccept)
	}
	return errors.Join(append(errs, s.flush(ctx))...)
}

// delivery is one record handed out by a Source.
type delivery struct {
	s *Source
	e *entry
}

// Message implements driver.Delivery.
func (d *delivery) Message() *driver.Message { return &d.e.D.Message }

// claim claims d's settlement. A stale one is marked all the same, so
// that franz-go's next poll does not accept it, and always as a release,
// whatever the settlement was: the stale error tells the Consumer the
// broker delivers the record again, and an accept that still reached the
// broker (a Source closed while its member had not yet left) would make
// that untrue. The broker refuses the release once the lock is gone.
func (d *delivery) claim() error {
	err := d.s.set.Settle(d.e)
	if err != nil && errors.Is(err, driver.ErrStaleDelivery) {
		d.s.mark(d.e.D, kgo.AckRelease)
	}
	if err != nil {
		return fmt.Errorf("kafkashare: record %s: %w", origin(d.e.D.r), err)
	}
	return nil
}

// settle claims d's settlement, marks status and flushes it.
func (d *delivery) settle(ctx context.Context, status kgo.AckStatus) error {
	if err := d.claim(); err != nil {
		return err
	}
	d.s.mark(d.e.D, status)
	return d.s.flush(ctx)
}

// Ack implements driver.Delivery with ACCEPT.
func (d *delivery) Ack(ctx context.Context) error { return d.settle(ctx, kgo.AckAccept) }

// Retry implements driver.Delivery with RELEASE, after delay: the record
// stays locked to this member until then (no longer than its lock has
// left, less a tenth), and its member polls again only once it is
// released.
func (d *delivery) Retry(ctx context.Context, delay time.Duration) error {
	s := d.s
	hold := min(delay, time.Until(s.set.Lapses(d.e))-s.lock/10)
	if hold <= 0 {
		return d.settle(ctx, kgo.AckRelease)
	}
	if err := d.claim(); err != nil {
		return err
	}
	release := func() { s.mark(d.e.D, kgo.AckRelease) }
	if !s.delays.After(hold, release) {
		release() // closing: the leave releases it anyway
	}
	return nil
}

// DeadLetter implements driver.Delivery: a copy of the record, with the
// cause and the other bookkeeping headers, is produced to the dead-letter
// topic, then the record is rejected (REJECT: the broker archives it).
// When the copy fails the record is released, never rejected.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	if err := d.claim(); err != nil {
		return err
	}
	s, r, m := d.s, d.e.D.r, &d.e.D.Message
	mark := deadletter.Mark{Cause: deadletter.Cause(cause), Attempt: m.Attempt, Origin: origin(r), Destination: r.Topic, At: time.Now()}
	extra := mark.Headers()
	extra[HeaderGroup] = s.c.group
	cp := &kgo.Record{Topic: s.c.deadLetterTopic, Key: r.Key, Value: r.Value, Timestamp: mark.At}
	for _, h := range r.Headers {
		if _, replaced := extra[h.Key]; !replaced {
			cp.Headers = append(cp.Headers, h)
		}
	}
	for _, k := range deadletter.Bookkeeping {
		if v, ok := extra[k]; ok {
			cp.Headers = append(cp.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	cp.Headers = append(cp.Headers, kgo.RecordHeader{Key: HeaderGroup, Value: []byte(s.c.group)})
	status := kgo.AckReject
	perr := s.admin.ProduceSync(ctx, cp).FirstErr()
	if perr != nil {
		status = kgo.AckRelease
	}
	s.mark(d.e.D, status)
	if err := s.flush(ctx); err != nil || perr == nil {
		return err
	}
	return fmt.Errorf("kafkashare: dead-lettering record %s to %s (released for redelivery): %w", origin(r), s.c.deadLetterTopic, perr)
}
