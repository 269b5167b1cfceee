package redis

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"slices"
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
	fetch   sync.Mutex // held while fetching
	room    unsettled.Room
	done    chan struct{} // closed by Close
	stopHB  context.CancelFunc
	hb      sync.WaitGroup
	mu      sync.Mutex
	buf     []*entry // fetched, not yet handed out
	window  int
	history string   // where the read-back of the consumer's own pending entries goes on; "" once done
	cursor  string   // of XAUTOCLAIM
	unacked []string // entries whose XACK failed, sent again by the heartbeat
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
	s := &Source{link: l, window: l.c.window, history: "0", cursor: "0-0", room: unsettled.NewRoom(), done: make(chan struct{}),
		// A tenth short of min_idle: the server's idle time starts before
		// the reply arrives. The heartbeat beats every quarter of min_idle,
		// so the third beat after the last good one still comes in time:
		// two beats in a row may fail before an entry lapses.
		set: unsettled.New[string, *driver.Message](l.c.minIdle*9/10, l.c.maxExtension)}
	if err := s.declare(ctx); err != nil {
		l.close()
		return nil, err
	}
	hb, stop := context.WithCancel(context.Background())
	s.stopHB = stop
	s.hb.Go(func() { unsettled.Heartbeat(hb, s.beatEvery(), s.beat) })
	return s, nil
}

// beatEvery is the heartbeat's period: a quarter of min_idle.
func (s *Source) beatEvery() time.Duration { return s.c.minIdle / 4 }

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

// HorizonHint implements driver.HorizonHinter: each of the two streams
// may keep entries half the retention. A producer outside idemq trims the
// stream itself, as it adds or from a job; the job's period counts into
// the age, so it trims a tenth younger, every tenth.
func (s *Source) HorizonHint(retention time.Duration) string {
	age := max((retention / 2).Truncate(time.Second), time.Second)
	every := max((age / 10).Truncate(time.Second), time.Second)
	return fmt.Sprintf("trim stream %s and its dead-letter stream %s to entries younger than %v: add max_age=%v to the URL of every idemq publisher, source and dead-letter tool of the stream (the sources trim the dead-letter stream and report the horizon); "+
		"a producer outside idemq trims the stream as it adds (XADD %s MINID ~ <now−%v in ms> * …), or a job runs XTRIM %s MINID ~ <now−%v in ms> at least every %v",
		s.stream, s.c.dlq, age, age, s.stream, age, s.stream, age-every, every)
}

// Receive implements driver.Source: the entries the consumer name holds
// (of a predecessor under the same name) come first, then entries idle
// for min_idle (retried, given back, or of a consumer that died) before
// new ones.
func (s *Source) Receive(ctx context.Context) (driver.Delivery, error) {
	return unsettled.Serial(ctx, &s.fetch, s.next)
}

// next hands out a fetched entry, or fetches; nil, nil: nothing yet.
func (s *Source) next(ctx context.Context) (driver.Delivery, error) {
	s.mu.Lock()
	closed, room, claimAt, history := s.closed, s.window-s.set.Len(), s.claimAt, s.history
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
	case history != "":
		err = s.readBack(ctx, room, history)
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

// readBack reads up to n of the entries pending to the consumer name
// after the entry id from (XREADGROUP … from): what a predecessor under
// the same name held when it died or stopped. Their attempts are their
// delivery counts, which the read raised; those deleted from the stream
// are acknowledged. An empty answer ends the read-back.
func (s *Source) readBack(ctx context.Context, n int, from string) error {
	res, err := s.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{
		Group: s.c.group, Consumer: s.c.consumer, Streams: []string{s.stream, from}, Count: int64(n), Block: -1}).Result()
	if err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("redis: reading back the entries %s/%s holds in %s: %w", s.c.group, s.c.consumer, s.stream, err)
	}
	var msgs []goredis.XMessage
	var deleted []string
	next := "" // the last entry answered, in id order
	for _, st := range res {
		for _, x := range st.Messages {
			if next = x.ID; x.Values == nil {
				deleted = append(deleted, x.ID)
			} else {
				msgs = append(msgs, x)
			}
		}
	}
	if from == "0" && next != "" {
		s.log.Log().Info("idemq redis: reading back the entries this consumer name held", "stream", s.stream, "group", s.c.group, "consumer", s.c.consumer)
	}
	if err := s.ackDeleted(ctx, deleted); err != nil {
		return err
	}
	if len(msgs) > 0 {
		attempts, err := s.attempts(ctx, msgs)
		if err != nil { // not handed out: read back again
			return err
		}
		s.add(ctx, msgs, attempts)
	}
	s.mu.Lock()
	s.history = next
	s.mu.Unlock()
	return nil
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
	if err := s.ackDeleted(ctx, deleted); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	attempts, err := s.attempts(ctx, msgs)
	if err != nil { // not handed out, they come back after min_idle
		return err
	}
	s.add(ctx, msgs, attempts)
	return nil
}

// ackDeleted acknowledges the pending entries deleted from the stream,
// which the server reports without their fields.
func (s *Source) ackDeleted(ctx context.Context, deleted []string) error {
	if len(deleted) == 0 {
		return nil
	}
	s.log.Log().Warn("idemq redis: entries deleted from the stream while pending; acknowledging them", "stream", s.stream, "group", s.c.group, "ids", deleted)
	if err := s.rdb.XAck(ctx, s.stream, s.c.group, deleted...).Err(); err != nil {
		return fmt.Errorf("redis: acknowledging deleted entries of %s: %w", s.stream, err)
	}
	return nil
}

// attempts returns the delivery counts of entries just claimed or read
// back (XPENDING of each, in one pipeline).
func (s *Source) attempts(ctx context.Context, msgs []goredis.XMessage) ([]int, error) {
	pipe := s.rdb.Pipeline()
	for _, m := range msgs {
		pipe.XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: s.stream, Group: s.c.group, Start: m.ID, End: m.ID, Count: 1})
	}
	counts, err := pipe.Exec(ctx)
	if err != nil {
		return nil, fmt.Errorf("redis: reading the delivery counts of entries of %s: %w", s.stream, err)
	}
	attempts := make([]int, len(msgs))
	for i, c := range counts {
		attempts[i] = 2 // no longer pending: moot
		if p := c.(*goredis.XPendingExtCmd).Val(); len(p) == 1 {
			attempts[i] = int(p[0].RetryCount)
		}
	}
	return attempts, nil
}

// read reads up to n new entries (XREADGROUP >), blocking up to block.
func (s *Source) read(ctx context.Context, n int, block time.Duration) error {
	res, err := s.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{
		Group: s.c.group, Consumer: s.c.consumer, Streams: []string{s.stream, ">"}, Count: int64(n), Block: max(block, time.Millisecond)}).Result()
	if err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("redis: reading %s as %s/%s: %w", s.stream, s.c.group, s.c.consumer, err)
	}
	for _, st := range res {
		s.add(ctx, st.Messages, nil)
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
// Close gives them back. An entry without the body field is parked at
// once: no handler can do anything right with it.
func (s *Source) add(ctx context.Context, msgs []goredis.XMessage, attempts []int) {
	var back []*entry
	for i, x := range msgs {
		m := &received{Message: s.message(x.Values), s: s, entryID: x.ID}
		m.Source, m.System, m.Attempt, m.ReceivedAt = s.stream, "redis", 1, time.Now()
		if attempts != nil {
			m.Attempt = attempts[i]
		}
		m.Metadata = (*metadata)(m)
		if m.Body == nil {
			s.parkBodyless(ctx, x.ID, &m.Message)
			continue
		}
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

// parkBodyless parks the entry id, whose message m has no body field,
// with a cause naming the field; it stays pending, to be tried again
// after min_idle, when parking fails.
func (s *Source) parkBodyless(ctx context.Context, id string, m *driver.Message) {
	where := "body_field= names the field that holds the body"
	if s.c.bodyField != BodyField {
		where = "body_field=" + s.c.bodyField
	}
	cause := fmt.Errorf("redis: entry %s of %s has no %s field (%s); its fields: %s", id, s.stream, s.c.bodyField, where, s.fieldNames(m))
	if err := s.park(ctx, id, m, cause); err != nil {
		s.log.Log().Warn("idemq redis: parking an entry without a body failed; it is tried again after min_idle", "stream", s.stream, "group", s.c.group, "entry", id, "id", m.ID, "dlq", s.c.dlq, "cause", cause, "error", err)
		return
	}
	s.log.Log().Error("idemq redis: entry without a body parked", "stream", s.stream, "group", s.c.group, "entry", id, "id", m.ID, "dlq", s.c.dlq, "cause", cause)
}

// fieldNames lists the names of the fields m was read from, in order, up
// to ten.
func (l *link) fieldNames(m *driver.Message) string {
	names := slices.Collect(maps.Keys(m.Headers))
	if m.ID != "" {
		names = append(names, l.c.idField)
	}
	if m.Key != "" {
		names = append(names, KeyField)
	}
	if m.Body != nil {
		names = append(names, l.c.bodyField)
	}
	slices.Sort(names)
	if len(names) > 10 {
		names = append(names[:10], "…")
	}
	return strings.Join(names, ", ")
}

// park adds the entry id's message m with the bookkeeping fields to the
// dead-letter stream and acknowledges the entry, in one MULTI/EXEC.
func (s *Source) park(ctx context.Context, id string, m *driver.Message, cause error) error {
	mark := deadletter.Mark{Cause: deadletter.Cause(cause), Attempt: m.Attempt, Origin: s.stream + "/" + s.c.group + "/" + id, Destination: s.stream, At: time.Now()}
	tx := s.rdb.TxPipeline()
	s.xadd(ctx, tx, s.c.dlq, append(s.fields(m.Headers, m.ID, m.Key, m.Body), fieldList(mark.Headers())...))
	tx.XAck(ctx, s.stream, s.c.group, id)
	_, err := tx.Exec(ctx)
	return err
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

// beat keeps the unsettled entries leased, up to WithMaxExtension, and
// sends the XACKs that failed again. Only a beat the server answered
// extends a lease: after two failed beats in a row an entry lapses, and
// its settlement is stale.
func (s *Source) beat(now time.Time) {
	if due, sent := s.set.Due(now, s.c.minIdle), time.Now(); len(due) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), s.beatEvery())
		err := s.touch(ctx, 0, due...)
		cancel()
		if err != nil {
			s.log.Log().Warn("idemq redis: heartbeat failed; trying again next beat", "stream", s.stream, "entries", len(due), "error", err)
		} else {
			s.set.Extended(due, sent)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.beatEvery())
	defer cancel()
	s.ackAgain(ctx)
}

// xack acknowledges the entries ids, keeping them to be sent again when
// the XACK fails: their effects are committed, so they are done whoever
// holds them by then.
func (s *Source) xack(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	err := s.rdb.XAck(ctx, s.stream, s.c.group, ids...).Err()
	if err != nil {
		s.mu.Lock()
		s.unacked = append(s.unacked, ids...)
		s.mu.Unlock()
	}
	return err
}

// ackAgain sends the XACKs that failed again.
func (s *Source) ackAgain(ctx context.Context) {
	s.mu.Lock()
	ids := s.unacked
	s.unacked = nil
	s.mu.Unlock()
	if err := s.xack(ctx, ids); err != nil {
		s.log.Log().Warn("idemq redis: sending failed acknowledgements again failed; trying again next beat", "stream", s.stream, "entries", len(ids), "error", err)
	} else if len(ids) > 0 {
		s.log.Log().Info("idemq redis: failed acknowledgements sent again", "stream", s.stream, "entries", len(ids))
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.ackAgain(ctx)
	if err := errors.Join(s.giveBack(s.set.Close()), s.close()); err != nil {
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
	if err := s.xack(ctx, ids); err != nil {
		errs = append(errs, fmt.Errorf("redis: acking %d entries of %s (sent again with the next heartbeat): %w", len(ids), s.stream, err))
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
// vain, and the fields the entry has.
func (d *delivery) IDError() error {
	where := "id_field= names the field that holds the id"
	if d.s.c.idField != DefaultIDField {
		where = "id_field=" + d.s.c.idField
	}
	return fmt.Errorf("redis: entry %s of %s has no %s field, or an empty one (%s); its fields: %s", d.e.Key, d.s.stream, d.s.c.idField, where, d.s.fieldNames(d.e.D))
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

// Ack implements driver.Delivery with XACK, sent again with the next
// heartbeat when it fails.
func (d *delivery) Ack(ctx context.Context) error {
	if err := d.s.settle(d.e); err != nil {
		return err
	}
	if err := d.s.xack(ctx, []string{d.e.Key}); err != nil {
		return fmt.Errorf("redis: ack of entry %s of %s (sent again with the next heartbeat): %w", d.e.Key, d.s.stream, err)
	}
	return nil
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
	return d.settle("dead-letter to "+s.c.dlq, func() error { return s.park(ctx, d.e.Key, m, cause) })
}
