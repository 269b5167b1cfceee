package redis

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/unsettled"
)

type entry = unsettled.Entry[string, *driver.Message]

// Source consumes a stream in a consumer group. It implements driver's
// Source, BatchSettler, WindowSetter, LoggerSetter, RedeliveryHorizoner
// and HorizonHinter. Receive may be called from several goroutines.
type Source struct {
	*link
	set     *unsettled.Set[string, *driver.Message]
	log     unsettled.Logger
	fetch   sync.Mutex // held while fetching
	room    unsettled.Room
	done    chan struct{} // closed by Close
	stopHB  context.CancelFunc
	hb      sync.WaitGroup
	mu      sync.Mutex
	buf     []*entry // fetched, not yet handed out
	window  int
	cursor  string // of XAUTOCLAIM
	claimAt time.Time
	closed  bool
}

// Open opens a Source on stream at addr (host:port), creating the group
// (MKSTREAM, from WithStart) unless it exists, and starts the heartbeat.
func Open(ctx context.Context, addr string, opts ...Option) (*Source, error) {
	l, err := connect(ctx, addr, true, opts)
	if err != nil {
		return nil, err
	}
	s := &Source{link: l, window: l.c.window, cursor: "0-0", room: unsettled.NewRoom(), done: make(chan struct{}),
		// A tenth short of min_idle: the server's idle time starts before the reply arrives.
		set: unsettled.New[string, *driver.Message](l.c.minIdle*9/10, l.c.maxExtension)}
	s.log.Init(l.c.logger)
	if err := s.declare(ctx); err != nil {
		l.rdb.Close()
		return nil, err
	}
	hb, stop := context.WithCancel(context.Background())
	s.stopHB = stop
	s.hb.Go(func() { unsettled.Heartbeat(hb, l.c.minIdle/3, s.beat) })
	return s, nil
}

// declare creates the group and checks the dead-letter key is a stream:
// DeadLetter's EXEC would run its XACK after a refused XADD.
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

// SetWindow implements driver.WindowSetter.
func (s *Source) SetWindow(n int) error {
	if n < 1 {
		return fmt.Errorf("redis: window %d must be positive", n)
	}
	s.mu.Lock()
	s.window = n
	s.mu.Unlock()
	return nil
}

// RedeliveryHorizon implements driver.RedeliveryHorizoner: Redis keeps an
// entry until an XADD trims it, so the horizon is twice WithMaxAge (stream
// and dead-letter stream), and driver.Unbounded without it (WithMaxLen
// bounds no age).
func (s *Source) RedeliveryHorizon(context.Context) (time.Duration, bool) {
	if s.c.maxAge > 0 {
		return 2 * s.c.maxAge, true
	}
	return driver.Unbounded, true
}

// HorizonHint implements driver.HorizonHinter.
func (s *Source) HorizonHint(retention time.Duration) string {
	return fmt.Sprintf("trim stream %s and its dead-letter stream %s by age: add max_age=%v to the URL of every publisher, source and dead-letter tool of the stream",
		s.stream, s.c.dlq, max((retention/2).Truncate(time.Second), time.Second))
}

// Receive implements driver.Source: entries idle for min_idle (retried,
// given back, or of a consumer that died) come before new ones.
func (s *Source) Receive(ctx context.Context) (driver.Delivery, error) {
	return unsettled.Serial(ctx, &s.fetch, s.next)
}

// next hands out a fetched entry, or fetches; nil, nil: nothing yet.
func (s *Source) next(ctx context.Context) (driver.Delivery, error) {
	s.mu.Lock()
	closed, room, claimAt := s.closed, s.window-s.set.Len(), s.claimAt
	s.mu.Unlock()
	switch d := s.pop(); {
	case closed:
		return nil, driver.ErrSourceClosed
	case d != nil:
		return d, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	}
	var err error
	switch now := time.Now(); {
	case room <= 0:
		select {
		case <-s.room.Wait():
		case <-s.done:
		case <-ctx.Done():
		case <-time.After(s.c.poll):
		}
	case !now.Before(claimAt):
		err = s.claim(ctx, room)
	default:
		err = s.read(ctx, room, min(s.c.poll, claimAt.Sub(now)))
	}
	if d := s.pop(); d != nil {
		return d, nil
	}
	if err != nil && strings.Contains(err.Error(), "NOGROUP") {
		err = errors.Join(err, s.declare(ctx)) // the server lost the stream
	}
	return nil, err
}

func (s *Source) pop() driver.Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.buf) == 0 {
		return nil
	}
	e := s.buf[0]
	s.buf = s.buf[1:]
	return &delivery{s, e}
}

// claim reclaims up to n idle entries, their attempts the delivery counts,
// and acknowledges those deleted from the stream while pending.
func (s *Source) claim(ctx context.Context, n int) error {
	msgs, next, deleted, err := s.rdb.XAutoClaimWithDeleted(ctx, &goredis.XAutoClaimArgs{
		Stream: s.stream, Group: s.c.group, Consumer: s.c.consumer, MinIdle: s.c.minIdle, Start: s.cursor, Count: int64(n)}).Result()
	s.mu.Lock()
	if err == nil {
		s.cursor = next
	}
	if err != nil || len(msgs) == 0 || next == "0-0" { // on at once only while claiming
		s.claimAt = time.Now().Add(s.c.poll)
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("redis: reclaiming idle entries of %s: %w", s.stream, err)
	}
	if len(deleted) > 0 {
		s.log.Log().Warn("idemq redis: entries deleted from the stream while pending; acknowledging them", "stream", s.stream, "group", s.c.group, "ids", deleted)
		if err := s.rdb.XAck(ctx, s.stream, s.c.group, deleted...).Err(); err != nil {
			return fmt.Errorf("redis: acknowledging deleted entries of %s: %w", s.stream, err)
		}
	}
	pipe := s.rdb.Pipeline()
	for _, m := range msgs {
		pipe.XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: s.stream, Group: s.c.group, Start: m.ID, End: m.ID, Count: 1})
	}
	counts, err := pipe.Exec(ctx)
	if err != nil { // not handed out, they come back after min_idle
		return fmt.Errorf("redis: reading the delivery counts of reclaimed entries of %s: %w", s.stream, err)
	}
	attempts := make([]int, len(msgs))
	for i, c := range counts {
		attempts[i] = 2 // no longer pending: moot
		if p := c.(*goredis.XPendingExtCmd).Val(); len(p) == 1 {
			attempts[i] = int(p[0].RetryCount)
		}
	}
	s.add(msgs, attempts)
	return nil
}

// read reads up to n new entries (XREADGROUP >), blocking up to block.
func (s *Source) read(ctx context.Context, n int, block time.Duration) error {
	res, err := s.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{
		Group: s.c.group, Consumer: s.c.consumer, Streams: []string{s.stream, ">"}, Count: int64(n), Block: max(block, time.Millisecond)}).Result()
	if err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("redis: reading %s as %s/%s: %w", s.stream, s.c.group, s.c.consumer, err)
	}
	for _, st := range res {
		s.add(st.Messages, nil)
	}
	return nil
}

// received is a fetched entry's Message and what its Metadata reads.
type received struct {
	driver.Message
	s       *Source
	entryID string
}

// metadata is a received entry's Message.Metadata, read from it when
// asked.
type metadata received

// All yields the stream, the consumer group and the entry's id.
func (m *metadata) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		_ = yield("messaging.destination.name", m.s.stream) &&
			yield("messaging.consumer.group.name", m.s.c.group) &&
			yield("messaging.redis.entry_id", m.entryID)
	}
}

// add buffers fetched entries (attempt 1 unless attempts says), or after
// Close gives them back.
func (s *Source) add(msgs []goredis.XMessage, attempts []int) {
	var back []*entry
	for i, x := range msgs {
		m := &received{Message: message(s.c.idField, x.Values), s: s, entryID: x.ID}
		m.Source, m.System, m.Attempt, m.ReceivedAt = s.stream, "redis", 1, time.Now()
		if attempts != nil {
			m.Attempt = attempts[i]
		}
		m.Metadata = (*metadata)(m)
		s.mu.Lock()
		if e := s.set.Add(x.ID, &m.Message); e != nil {
			s.buf = append(s.buf, e)
		} else {
			back = append(back, &entry{Key: x.ID})
		}
		s.mu.Unlock()
	}
	_ = s.giveBack(back) // failed, they come back after min_idle
}

// touch sets the entries' idle time, keeping their delivery counts.
func (s *Source) touch(ctx context.Context, idle time.Duration, es ...*entry) error {
	args := []any{"xclaim", s.stream, s.c.group, s.c.consumer, 0}
	for _, e := range es {
		args = append(args, e.Key)
	}
	return s.rdb.Do(ctx, append(args, "idle", idle.Milliseconds(), "justid")...).Err()
}

// giveBack makes entries idle for min_idle: the group reclaims them.
func (s *Source) giveBack(es []*entry) error {
	if len(es) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.touch(ctx, s.c.minIdle, es...)
}

// beat keeps the unsettled entries leased, up to WithMaxExtension.
func (s *Source) beat(now time.Time) {
	due, sent := s.set.Due(now, s.c.minIdle), time.Now()
	if len(due) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.c.minIdle/3)
	defer cancel()
	if err := s.touch(ctx, 0, due...); err != nil {
		s.log.Log().Warn("idemq redis: heartbeat failed; trying again next beat", "stream", s.stream, "entries", len(due), "error", err)
		return
	}
	s.set.Extended(due, sent)
}

// Close implements driver.Source: it gives every unsettled entry back at
// once; settling one afterwards returns a stale error.
func (s *Source) Close() error {
	s.mu.Lock()
	closed := s.closed
	s.closed, s.buf = true, nil
	s.mu.Unlock()
	if closed {
		return nil
	}
	close(s.done)
	s.fetch.Lock() // waits for a read under way
	s.fetch.Unlock()
	s.stopHB()
	s.hb.Wait()
	if err := errors.Join(s.giveBack(s.set.Close()), s.rdb.Close()); err != nil {
		return fmt.Errorf("redis: closing the source of %s (giving entries back): %w", s.stream, err)
	}
	return nil
}

// settle claims e's settlement (nil: send it) and wakes Receive.
func (s *Source) settle(e *entry) error {
	err := s.set.Settle(e)
	s.room.Made()
	return err
}

// AckBatch implements driver.BatchSettler with one XACK; the joined error
// names the deliveries settled before, stale or of another source.
func (s *Source) AckBatch(ctx context.Context, ds []driver.Delivery) error {
	own, errs := unsettled.Take("redis", ds, func(d *delivery) bool { return d.s == s }, func(d *delivery) error { return s.settle(d.e) })
	ids := make([]string, len(own))
	for i, d := range own {
		ids[i] = d.e.Key
	}
	if len(ids) > 0 {
		if err := s.rdb.XAck(ctx, s.stream, s.c.group, ids...).Err(); err != nil {
			errs = append(errs, fmt.Errorf("redis: acking %d entries of %s: %w", len(ids), s.stream, err))
		}
	}
	return errors.Join(errs...)
}

// delivery is one entry handed out by a Source.
type delivery struct {
	s *Source
	e *entry
}

// Message implements driver.Delivery.
func (d *delivery) Message() *driver.Message { return d.e.D }

// IDError implements driver.IDErrorer: where the id was looked for in
// vain.
func (d *delivery) IDError() error {
	return fmt.Errorf("redis: entry %s of %s has no %s field, or an empty one (id_field= names the field that holds the id)", d.e.Key, d.s.stream, d.s.c.idField)
}

// settle settles d by send, unless settled before or stale.
func (d *delivery) settle(what string, send func() error) error {
	if err := d.s.settle(d.e); err != nil {
		return err
	}
	if err := send(); err != nil {
		return fmt.Errorf("redis: %s of entry %s of %s: %w", what, d.e.Key, d.s.stream, err)
	}
	return nil
}

// Ack implements driver.Delivery with XACK.
func (d *delivery) Ack(ctx context.Context) error {
	return d.settle("ack", func() error { return d.s.rdb.XAck(ctx, d.s.stream, d.s.c.group, d.e.Key).Err() })
}

// Retry implements driver.Delivery: the entry stays pending, to reach
// min_idle after delay (at most min_idle) and be reclaimed.
func (d *delivery) Retry(ctx context.Context, delay time.Duration) error {
	return d.settle("retry", func() error { return d.s.touch(ctx, max(d.s.c.minIdle-delay, 0), d.e) })
}

// DeadLetter implements driver.Delivery: one MULTI/EXEC adds the message
// and the bookkeeping fields to the dead-letter stream and acknowledges
// the entry.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	s, m := d.s, d.e.D
	return d.settle("dead-letter to "+s.c.dlq, func() error {
		mark := deadletter.Mark{Cause: deadletter.Cause(cause), Attempt: m.Attempt, Origin: s.stream + "/" + s.c.group + "/" + d.e.Key, Destination: s.stream, At: time.Now()}
		tx := s.rdb.TxPipeline()
		s.xadd(ctx, tx, s.c.dlq, append(s.fields(m.Headers, m.ID, m.Key, m.Body), fieldList(mark.Headers())...))
		tx.XAck(ctx, s.stream, s.c.group, d.e.Key)
		_, err := tx.Exec(ctx)
		return err
	})
}
