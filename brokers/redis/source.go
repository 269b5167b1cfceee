package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/unsettled"
)

// errGone is the reason of a settlement of an entry the heartbeat found no
// longer pending: another consumer settled it, or it was deleted.
var errGone = errors.New("redis: the entry is no longer pending: another consumer settled it, or it was deleted from the stream")

type entry = unsettled.Entry[string, *driver.Message]

// Source consumes a stream through a consumer group with explicit acks.
// It implements driver.Source, driver.BatchSettler, driver.WindowSetter,
// driver.LoggerSetter, driver.RedeliveryHorizoner and
// driver.HorizonHinter. Receive may be called from several goroutines.
type Source struct {
	*link
	stream string
	set    *unsettled.Set[string, *driver.Message]
	log    unsettled.Logger
	fetch  chan struct{} // held by the one goroutine fetching
	room   chan struct{} // a settlement made room in the window
	done   chan struct{} // closed by Close
	stopHB context.CancelFunc
	hbDone chan struct{}

	mu      sync.Mutex
	buf     []*entry // fetched, not yet handed out
	window  int
	cursor  string // of XAUTOCLAIM
	claimAt time.Time
	closed  bool
}

// Open opens a Source on stream at addr (host:port): it connects, creates
// the group WithGroup names (MKSTREAM, from WithStart) unless it exists,
// and starts the heartbeat. Entries are read from the first Receive on.
func Open(ctx context.Context, addr, stream string, opts ...Option) (*Source, error) {
	l, err := connect(ctx, addr, stream, true, opts)
	if err != nil {
		return nil, err
	}
	s := &Source{link: l, stream: stream, window: l.c.window, cursor: "0-0", fetch: make(chan struct{}, 1),
		room: make(chan struct{}, 1), done: make(chan struct{}), hbDone: make(chan struct{})}
	// The lease is a tenth shorter than min_idle: the server's idle time
	// starts before the reply reaches the Source.
	s.set = unsettled.New[string, *driver.Message](l.c.minIdle*9/10, l.c.maxExtension)
	s.log.Init(l.c.logger)
	if err := s.declare(ctx); err != nil {
		l.close()
		return nil, err
	}
	hb, cancel := context.WithCancel(context.Background())
	s.stopHB = cancel
	go func() {
		defer close(s.hbDone)
		unsettled.Heartbeat(hb, l.c.minIdle/3, s.beat)
	}()
	return s, nil
}

// declare creates the group, and checks the dead-letter key is a stream.
func (s *Source) declare(ctx context.Context) error {
	err := s.rdb.XGroupCreateMkStream(ctx, s.stream, s.c.group, s.c.start).Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("redis: creating group %s of stream %s: %w", s.c.group, s.stream, err)
	}
	if t, err := s.rdb.Type(ctx, s.c.dlq).Result(); err != nil || (t != "none" && t != "stream") {
		return fmt.Errorf("redis: the dead-letter key %s must be a stream or absent (type %q): %v", s.c.dlq, t, err)
	}
	return nil
}

// SetLogger implements driver.LoggerSetter.
func (s *Source) SetLogger(l *slog.Logger) { s.log.SetLogger(l) }

// SetWindow implements driver.WindowSetter: at most n entries are held
// unsettled, from the next read on.
func (s *Source) SetWindow(n int) error {
	if n < 1 {
		return fmt.Errorf("redis: window %d must be positive", n)
	}
	s.mu.Lock()
	s.window = n
	s.mu.Unlock()
	return nil
}

// RedeliveryHorizon implements driver.RedeliveryHorizoner. Redis keeps an
// entry until it is trimmed, and trims only when an XADD asks: the horizon
// is twice WithMaxAge (the stream and the dead-letter stream) when the
// adapter trims by age, and driver.Unbounded otherwise, WithMaxLen
// included: a count bounds no age.
func (s *Source) RedeliveryHorizon(context.Context) (time.Duration, bool) {
	if s.c.maxAge > 0 {
		return 2 * s.c.maxAge, true
	}
	return driver.Unbounded, true
}

// HorizonHint implements driver.HorizonHinter: trim by age, at most half
// the retention, on every side.
func (s *Source) HorizonHint(retention time.Duration) string {
	age := max((retention / 2).Truncate(time.Second), time.Second)
	return fmt.Sprintf("trim stream %s and its dead-letter stream %s by age: add max_age=%v to the URL of every publisher, source and dead-letter tool of the stream", s.stream, s.c.dlq, age)
}

// Receive implements driver.Source. Entries idle for min_idle (retried,
// given back, or held by a consumer that died) are reclaimed before new
// ones are read. Errors other than ErrSourceClosed and ctx's are
// transient.
func (s *Source) Receive(ctx context.Context) (driver.Delivery, error) {
	for {
		select {
		case s.fetch <- struct{}{}:
		case <-s.done:
			return nil, driver.ErrSourceClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		d, err := s.next(ctx)
		<-s.fetch
		if d != nil || err != nil {
			return d, err
		}
	}
}

// next hands out a fetched entry, fetching when there is none; nil, nil
// when it found nothing to hand out.
func (s *Source) next(ctx context.Context) (driver.Delivery, error) {
	if s.isClosed() {
		return nil, driver.ErrSourceClosed
	}
	if d := s.pop(); d != nil {
		return d, nil
	}
	s.mu.Lock()
	room, claimAt := s.window-s.set.Len(), s.claimAt
	s.mu.Unlock()
	if room <= 0 {
		select {
		case <-s.room:
		case <-s.done:
		case <-ctx.Done():
		case <-time.After(s.c.poll):
		}
		return nil, nil
	}
	var err error
	if now := time.Now(); !now.Before(claimAt) {
		err = s.claim(ctx, room)
	} else {
		err = s.read(ctx, room, min(s.c.poll, claimAt.Sub(now)))
	}
	if d := s.pop(); d != nil {
		return d, nil
	}
	if s.isClosed() {
		return nil, driver.ErrSourceClosed
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err != nil && strings.HasPrefix(err.Error(), "NOGROUP") {
		err = errors.Join(err, s.declare(ctx)) // the server lost the stream
	}
	return nil, err
}

func (s *Source) pop() driver.Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.buf) == 0 || s.closed {
		return nil
	}
	e := s.buf[0]
	s.buf = s.buf[1:]
	return &delivery{s: s, e: e}
}

func (s *Source) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// claim reclaims up to n entries idle for min_idle (XAUTOCLAIM) and reads
// their delivery counts (XPENDING), the attempts. Entries deleted from the
// stream while pending are acknowledged, never reclaimed.
func (s *Source) claim(ctx context.Context, n int) error {
	msgs, next, deleted, err := s.rdb.XAutoClaimWithDeleted(ctx, &goredis.XAutoClaimArgs{
		Stream: s.stream, Group: s.c.group, Consumer: s.c.consumer, MinIdle: s.c.minIdle, Start: s.cursor, Count: int64(n),
	}).Result()
	if err != nil {
		s.mu.Lock()
		s.claimAt = time.Now().Add(s.c.poll)
		s.mu.Unlock()
		return fmt.Errorf("redis: reclaiming idle entries of %s: %w", s.stream, err)
	}
	s.mu.Lock()
	s.cursor = next
	if len(msgs) == 0 || next == "0-0" { // go on at once only while claiming
		s.claimAt = time.Now().Add(s.c.poll)
	}
	s.mu.Unlock()
	for _, m := range msgs {
		if m.Values == nil { // a deleted entry, as Redis 6.2 reports it
			deleted = append(deleted, m.ID)
		}
	}
	if len(deleted) > 0 {
		s.log.Log().Warn("idemq redis: entries deleted from the stream while pending; acknowledging them", "stream", s.stream, "group", s.c.group, "ids", deleted)
		if err := s.rdb.XAck(ctx, s.stream, s.c.group, deleted...).Err(); err != nil {
			return fmt.Errorf("redis: acknowledging deleted entries of %s: %w", s.stream, err)
		}
	}
	pipe := s.rdb.Pipeline()
	counts := make([]*goredis.XPendingExtCmd, len(msgs))
	for i, m := range msgs {
		counts[i] = pipe.XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: s.stream, Group: s.c.group, Start: m.ID, End: m.ID, Count: 1})
	}
	if _, err := pipe.Exec(ctx); err != nil && len(msgs) > 0 {
		// Not handed out, the entries come back after min_idle.
		return fmt.Errorf("redis: reading the delivery counts of reclaimed entries of %s: %w", s.stream, err)
	}
	var added []goredis.XMessage
	var attempts []int
	for i, m := range msgs {
		if p := counts[i].Val(); m.Values != nil && len(p) == 1 {
			added, attempts = append(added, m), append(attempts, int(p[0].RetryCount))
		}
	}
	s.add(added, attempts)
	return nil
}

// read reads up to n new entries (XREADGROUP >), blocking up to block.
func (s *Source) read(ctx context.Context, n int, block time.Duration) error {
	res, err := s.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{
		Group: s.c.group, Consumer: s.c.consumer, Streams: []string{s.stream, ">"}, Count: int64(n), Block: max(block, time.Millisecond),
	}).Result()
	if errors.Is(err, goredis.Nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("redis: reading %s as %s/%s: %w", s.stream, s.c.group, s.c.consumer, err)
	}
	for _, st := range res {
		s.add(st.Messages, nil)
	}
	return nil
}

// add records fetched entries (attempt 1 unless attempts says) and
// buffers them; after Close it gives them back.
func (s *Source) add(msgs []goredis.XMessage, attempts []int) {
	var back []string
	for i, xm := range msgs {
		m, _ := message(s.c.idField, xm.Values)
		m.Source, m.System, m.Attempt, m.ReceivedAt = s.stream, "redis", 1, time.Now()
		if attempts != nil {
			m.Attempt = attempts[i]
		}
		m.Metadata = map[string]string{
			"messaging.destination.name":    s.stream,
			"messaging.consumer.group.name": s.c.group,
			"messaging.redis.entry_id":      xm.ID,
		}
		e := s.set.Add(xm.ID, &m)
		if e == nil {
			back = append(back, xm.ID)
			continue
		}
		s.mu.Lock()
		s.buf = append(s.buf, e)
		s.mu.Unlock()
	}
	if len(back) > 0 {
		s.giveBack(back)
	}
}

// touch sets the idle time of the entries ids to idle, claiming them for
// this consumer without raising their delivery counts (XCLAIM … JUSTID),
// and returns the ids still pending.
func (s *Source) touch(ctx context.Context, idle time.Duration, ids ...string) ([]string, error) {
	args := []any{"xclaim", s.stream, s.c.group, s.c.consumer, 0}
	for _, id := range ids {
		args = append(args, id)
	}
	return s.rdb.Do(ctx, append(args, "idle", idle.Milliseconds(), "justid")...).StringSlice()
}

// giveBack makes entries idle for min_idle, so the group's next
// XAUTOCLAIM takes them at once.
func (s *Source) giveBack(ids []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.touch(ctx, s.c.minIdle, ids...); err != nil {
		s.log.Log().Warn("idemq redis: giving entries back failed; they come back after min_idle", "stream", s.stream, "entries", len(ids), "error", err)
	}
}

// beat keeps the unsettled entries leased: their idle times go back to
// zero (XCLAIM to this consumer, min-idle 0, JUSTID) every third of
// min_idle, up to WithMaxExtension after their receipt.
func (s *Source) beat(now time.Time) {
	due := s.set.Due(now, s.c.minIdle)
	if len(due) == 0 {
		return
	}
	ids := make([]string, len(due))
	for i, e := range due {
		ids[i] = e.Key
	}
	sent := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), s.c.minIdle/3)
	kept, err := s.touch(ctx, 0, ids...)
	cancel()
	if err != nil {
		s.log.Log().Warn("idemq redis: heartbeat failed; trying again next beat", "stream", s.stream, "entries", len(ids), "error", err)
		return
	}
	pending := make(map[string]bool, len(kept))
	for _, id := range kept {
		pending[id] = true
	}
	var ext []*entry
	for _, e := range due {
		if pending[e.Key] {
			ext = append(ext, e)
		} else {
			s.set.Drop(e, errGone)
		}
	}
	s.set.Extended(ext, sent)
}

// Close implements driver.Source: it stops reading and the heartbeat and
// gives every unsettled entry back (idle for min_idle, so the group
// reclaims them at once). Settling those deliveries afterwards returns a
// stale error.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.buf = nil
	s.mu.Unlock()
	close(s.done)
	s.fetch <- struct{}{} // wait for a read under way; never released
	s.stopHB()
	<-s.hbDone
	var ids []string
	for _, e := range s.set.Close() {
		ids = append(ids, e.Key)
	}
	var err error
	if len(ids) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = s.touch(ctx, s.c.minIdle, ids...)
		cancel()
	}
	if cerr := s.close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("redis: closing the source of %s (%d entries to give back): %w", s.stream, len(ids), err)
	}
	return nil
}

// settle claims e's settlement (driver.ErrAlreadySettled, or a stale error:
// then nothing may be sent) and tells a waiting Receive there is room.
func (s *Source) settle(e *entry) error {
	err := s.set.Settle(e)
	select {
	case s.room <- struct{}{}:
	default:
	}
	return err
}

// AckBatch implements driver.BatchSettler with one XACK for the batch.
// Deliveries settled before, stale or of another source are reported in
// the joined error; the others are acked.
func (s *Source) AckBatch(ctx context.Context, ds []driver.Delivery) error {
	var errs []error
	var ids []string
	for _, dd := range ds {
		d, ok := dd.(*delivery)
		if !ok || d.s != s {
			errs = append(errs, fmt.Errorf("redis: AckBatch given a delivery of another source (%T)", dd))
			continue
		}
		if err := s.settle(d.e); err != nil {
			errs = append(errs, err)
			continue
		}
		ids = append(ids, d.e.Key)
	}
	if len(ids) > 0 {
		if err := s.rdb.XAck(ctx, s.stream, s.c.group, ids...).Err(); err != nil {
			errs = append(errs, fmt.Errorf("redis: acking %d entries of %s: %w", len(ids), s.stream, err))
		}
	}
	return errors.Join(errs...)
}
