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
	"github.com/idemq/idemq/core/driver/retry"
)

// Source consumes a stream in a consumer group. It implements driver's
// Puller, Extender, Releaser, RedeliveryHorizoner and HorizonHinter.
type Source struct {
	*link
	fetch   sync.Mutex // held by Receive, over the three fields below
	history string     // where the read-back of the consumer's own pending entries goes on; "" once done
	cursor  string     // of XAUTOCLAIM
	claimAt time.Time

	life    context.Context // done once Close began
	stop    context.CancelFunc
	resend  sync.WaitGroup
	busy    sync.WaitGroup // settlement and Extend calls under way, which Close waits for
	mu      sync.Mutex     // over unacked, and busy.Add against Close
	unacked []string       // entries whose XACK failed, sent again
}

var (
	_ driver.Puller   = (*Source)(nil)
	_ driver.Extender = (*Source)(nil)
	_ driver.Releaser = (*Source)(nil)
)

// Open opens a Source on stream at addr (host:port), creating the group
// (MKSTREAM, from WithStart) unless it exists.
func Open(ctx context.Context, addr string, opts ...Option) (*Source, error) {
	l, err := connect(ctx, addr, true, opts)
	if err != nil {
		return nil, err
	}
	s := &Source{link: l, history: "0", cursor: "0-0"}
	if err := s.declare(ctx); err != nil {
		l.close()
		return nil, err
	}
	s.life, s.stop = context.WithCancel(context.Background())
	s.resend.Go(func() { retry.Every(s.life, s.c.minIdle/4, func(time.Time) { s.ackAgain(s.life) }) })
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

// Start implements driver.Source: the lease is a tenth short of min_idle,
// since the server's idle time starts before the reply arrives; the
// broker keeps Retry's delay (up to min_idle).
func (s *Source) Start(_ context.Context, setup driver.Setup) (driver.Traits, error) {
	if s.c.logger == nil && setup.Logger != nil {
		s.log.Store(setup.Logger)
	}
	return driver.Traits{Lease: s.c.minIdle * 9 / 10, MaxExtension: s.c.maxExtension, DelaysRetry: true}, nil
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
// may keep entries half the retention; a trimming job's period counts into
// the age, so it trims a tenth younger, every tenth.
func (s *Source) HorizonHint(retention time.Duration) string {
	age := max((retention / 2).Truncate(time.Second), time.Second)
	every := max((age / 10).Truncate(time.Second), time.Second)
	return fmt.Sprintf("trim stream %s and its dead-letter stream %s to entries younger than %v: add max_age=%v to the URL of every idemq publisher, source and dead-letter tool of the stream (the sources trim the dead-letter stream and report the horizon); "+
		"a producer outside idemq trims the stream as it adds (XADD %s MINID ~ <now−%v in ms> * …), or a job runs XTRIM %s MINID ~ <now−%v in ms> at least every %v",
		s.stream, s.c.dlq, age, age, s.stream, age, s.stream, age-every, every)
}

// Receive implements driver.Puller: the entries the consumer name holds
// (of a predecessor under the same name) come first, then entries idle
// for min_idle before new ones.
func (s *Source) Receive(ctx context.Context, n int) ([]*driver.Message, error) {
	s.fetch.Lock()
	defer s.fetch.Unlock()
	for ctx.Err() == nil && s.life.Err() == nil {
		var xs []goredis.XMessage
		var err error
		again := true // xs were delivered before: their delivery counts are their attempts
		switch now := time.Now(); {
		case s.history != "":
			xs, err = s.read(ctx, n, s.history, -1)
		case !now.Before(s.claimAt):
			xs, err = s.claim(ctx, n)
		default:
			again = false
			xs, err = s.read(ctx, n, ">", max(min(s.c.poll, s.claimAt.Sub(now)), time.Millisecond))
		}
		var attempts []int
		if len(xs) > 0 && again {
			attempts, err = s.attempts(ctx, xs) // failed: not handed out, they come back after min_idle
		}
		switch {
		case s.life.Err() != nil: // not handed out
			s.giveBack(xs)
		case err != nil && strings.Contains(err.Error(), "NOGROUP"):
			return nil, errors.Join(err, s.declare(ctx)) // the server lost the stream
		case err != nil:
			return nil, err
		case len(xs) > 0:
			return s.messages(xs, attempts), nil
		}
	}
	if s.life.Err() != nil {
		return nil, driver.ErrSourceClosed
	}
	return nil, ctx.Err()
}

// read reads up to n entries as the consumer name (XREADGROUP): new ones
// (">", blocking up to block), or those it holds after from (the
// read-back of a predecessor's, which goes on from s.history until an
// empty answer). Entries deleted while pending are acknowledged.
func (s *Source) read(ctx context.Context, n int, from string, block time.Duration) ([]goredis.XMessage, error) {
	res, err := s.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{
		Group: s.c.group, Consumer: s.c.consumer, Streams: []string{s.stream, from}, Count: int64(n), Block: block}).Result()
	if err != nil && !errors.Is(err, goredis.Nil) {
		return nil, fmt.Errorf("redis: reading %s after %s as %s/%s: %w", s.stream, from, s.c.group, s.c.consumer, err)
	}
	var xs []goredis.XMessage // the one stream's reply, filtered in place
	var deleted []string
	last := "" // the last entry answered, in id order
	for _, st := range res {
		xs = st.Messages[:0]
		for _, x := range st.Messages {
			if last = x.ID; x.Values == nil {
				deleted = append(deleted, x.ID)
			} else {
				xs = append(xs, x)
			}
		}
	}
	if from != ">" {
		if from == "0" && last != "" {
			s.logger().Info("idemq redis: reading back the entries this consumer name held", "stream", s.stream, "group", s.c.group, "consumer", s.c.consumer)
		}
		s.history = last
	}
	return xs, s.ackDeleted(ctx, deleted)
}

// claim reclaims up to n entries idle for min_idle and acknowledges those
// deleted from the stream while pending.
func (s *Source) claim(ctx context.Context, n int) ([]goredis.XMessage, error) {
	xs, next, deleted, err := s.rdb.XAutoClaimWithDeleted(ctx, &goredis.XAutoClaimArgs{
		Stream: s.stream, Group: s.c.group, Consumer: s.c.consumer, MinIdle: s.c.minIdle, Start: s.cursor, Count: int64(n)}).Result()
	if err != nil {
		s.claimAt = time.Now().Add(s.c.poll)
		return nil, fmt.Errorf("redis: reclaiming idle entries of %s: %w", s.stream, err)
	}
	if s.cursor = next; len(xs) == 0 || next == "0-0" { // on at once only while claiming
		s.claimAt = time.Now().Add(s.c.poll)
	}
	return xs, s.ackDeleted(ctx, deleted)
}

// ackDeleted acknowledges the pending entries deleted from the stream,
// which the server reports without their fields.
func (s *Source) ackDeleted(ctx context.Context, deleted []string) error {
	if len(deleted) == 0 {
		return nil
	}
	s.logger().Warn("idemq redis: entries deleted from the stream while pending; acknowledging them", "stream", s.stream, "group", s.c.group, "ids", deleted)
	if err := s.rdb.XAck(ctx, s.stream, s.c.group, deleted...).Err(); err != nil {
		return fmt.Errorf("redis: acknowledging deleted entries of %s: %w", s.stream, err)
	}
	return nil
}

// attempts returns the delivery counts of entries just claimed or read
// back (XPENDING of each, in one pipeline).
func (s *Source) attempts(ctx context.Context, xs []goredis.XMessage) ([]int, error) {
	pipe := s.rdb.Pipeline()
	for _, x := range xs {
		pipe.XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: s.stream, Group: s.c.group, Start: x.ID, End: x.ID, Count: 1})
	}
	counts, err := pipe.Exec(ctx)
	if err != nil {
		return nil, fmt.Errorf("redis: reading the delivery counts of entries of %s: %w", s.stream, err)
	}
	attempts := make([]int, len(xs))
	for i, c := range counts {
		attempts[i] = 2 // no longer pending: moot
		if p := c.(*goredis.XPendingExtCmd).Val(); len(p) == 1 {
			attempts[i] = int(p[0].RetryCount)
		}
	}
	return attempts, nil
}

// received is an entry's Message (AckID and BrokerKey the entry id) and
// the group its Metadata names.
type received struct {
	driver.Message
	group string
}

// metadata is a received entry's Message.Metadata, read when asked.
type metadata received

// All yields the stream, the consumer group and the entry's id.
func (m *metadata) All() iter.Seq2[string, slog.Value] {
	return func(yield func(string, slog.Value) bool) {
		_ = yield("messaging.destination.name", slog.StringValue(m.Source)) &&
			yield("messaging.consumer.group.name", slog.StringValue(m.group)) &&
			yield("messaging.redis.entry_id", slog.StringValue(m.BrokerKey.(string)))
	}
}

// messages are the entries xs as messages, attempt 1 unless attempts
// says. An entry without the id field, or without the body field, says
// where it was looked for and which fields the entry has.
func (s *Source) messages(xs []goredis.XMessage, attempts []int) []*driver.Message {
	ms := make([]*driver.Message, len(xs))
	rs := make([]received, len(xs)) // one allocation for the read
	now := time.Now()
	for i, x := range xs {
		r := &rs[i]
		r.Message, r.group = s.message(x.Values), s.c.group
		m := &r.Message
		id := any(x.ID) // one interface value for both: one allocation, not two
		m.Source, m.System, m.Attempt, m.ReceivedAt, m.Metadata, m.AckID, m.BrokerKey = s.stream, "redis", 1, now, (*metadata)(r), id, id
		if attempts != nil {
			m.Attempt = attempts[i]
		}
		if m.ID == "" {
			m.IDError = s.missing(x, "id", s.c.idField, DefaultIDField, ", or an empty one")
		}
		if m.Body == nil {
			m.Unreadable = s.missing(x, "body", s.c.bodyField, BodyField, "")
		}
		ms[i] = m
	}
	return ms
}

// missing says that entry x has no usable field for what, the field
// what_field= names (dflt by default), and lists the fields x has, in name
// order, up to ten.
func (s *Source) missing(x goredis.XMessage, what, field, dflt, orEmpty string) error {
	where := what + "_field= names the field that holds the " + what
	if field != dflt {
		where = what + "_field=" + field
	}
	names := slices.Sorted(maps.Keys(x.Values))
	if len(names) > 10 {
		names = append(names[:10], "…")
	}
	return fmt.Errorf("redis: entry %s of %s has no %s field%s (%s); its fields: %s", x.ID, s.stream, field, orEmpty, where, strings.Join(names, ", "))
}

// entries returns the entry ids of ms and holds Close off until the
// caller calls s.busy.Done; after Close the broker redelivers them (stale).
func (s *Source) entries(ms []*driver.Message) ([]string, error) {
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.BrokerKey.(string)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.life.Err() != nil {
		return nil, driver.Stale(fmt.Errorf("redis: the source of %s is closed", s.stream))
	}
	s.busy.Add(1)
	return ids, nil
}

// Ack implements driver.Source with one XACK, sent again every quarter of
// min_idle while it fails: the effects are committed, so the entries are
// done whoever holds them by then.
func (s *Source) Ack(ctx context.Context, ms []*driver.Message) error {
	ids, err := s.entries(ms)
	if err != nil {
		return err
	}
	defer s.busy.Done()
	if err := s.xack(ctx, ids); err != nil {
		return fmt.Errorf("redis: acking %d entries of %s (sent again every quarter of min_idle): %w", len(ids), s.stream, err)
	}
	return nil
}

// ackAgain sends the XACKs that failed again.
func (s *Source) ackAgain(ctx context.Context) {
	s.mu.Lock()
	ids := s.unacked
	s.unacked = nil
	s.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	if err := s.xack(ctx, ids); err != nil {
		s.logger().Warn("idemq redis: sending failed acknowledgements again failed; trying again", "stream", s.stream, "entries", len(ids), "error", err)
		return
	}
	s.logger().Info("idemq redis: failed acknowledgements sent again", "stream", s.stream, "entries", len(ids))
}

// xack acknowledges the entries ids, keeping them to send again when it
// fails.
func (s *Source) xack(ctx context.Context, ids []string) error {
	err := s.rdb.XAck(ctx, s.stream, s.c.group, ids...).Err()
	if err != nil {
		s.mu.Lock()
		s.unacked = append(s.unacked, ids...)
		s.mu.Unlock()
	}
	return err
}

// Retry implements driver.Source: the entries stay pending, idle so that
// min_idle passes after delay (at most min_idle), and the group's next
// XAUTOCLAIM hands them out again with a higher delivery count.
func (s *Source) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	return s.touch(ctx, "retry", ms, max(s.c.minIdle-delay, 0))
}

// Release implements driver.Releaser: the entries are idle for min_idle,
// so the group's next XAUTOCLAIM takes them at once.
func (s *Source) Release(ctx context.Context, ms []*driver.Message) error {
	return s.touch(ctx, "release", ms, s.c.minIdle)
}

// Extend implements driver.Extender: XCLAIM to the same consumer with
// IDLE 0 and JUSTID resets the entries' idle time and keeps their
// delivery counts. An entry the reply leaves out is no longer pending
// (deleted from the stream, or settled): stale.
func (s *Source) Extend(ctx context.Context, ms []*driver.Message) error {
	return s.touch(ctx, "heartbeat", ms, 0)
}

// touch sets the idle time of the entries of ms (XCLAIM … IDLE … JUSTID)
// for what.
func (s *Source) touch(ctx context.Context, what string, ms []*driver.Message, idle time.Duration) error {
	ids, err := s.entries(ms)
	if err != nil {
		return err
	}
	defer s.busy.Done()
	kept, err := s.xclaim(ctx, ids, idle)
	if err != nil {
		return fmt.Errorf("redis: %s of %d entries of %s: %w", what, len(ids), s.stream, err)
	}
	if len(kept) == len(ids) {
		return nil
	}
	errs := make([]error, len(ids))
	for i, id := range ids { // the reply keeps the order
		if len(kept) > 0 && kept[0] == id {
			kept = kept[1:]
		} else {
			errs[i] = driver.Stale(fmt.Errorf("redis: entry %s of %s is no longer pending", id, s.stream))
		}
	}
	return driver.PartialOf(errs)
}

// xclaim sets the entries' idle time, keeping them with the consumer and
// their delivery counts, and returns those still pending, in order.
func (s *Source) xclaim(ctx context.Context, ids []string, idle time.Duration) ([]string, error) {
	args := make([]any, 0, len(ids)+8)
	args = append(args, "xclaim", s.stream, s.c.group, s.c.consumer, 0)
	for _, id := range ids {
		args = append(args, id)
	}
	return s.rdb.Do(ctx, append(args, "idle", idle.Milliseconds(), "justid")...).StringSlice()
}

// giveBack makes entries read but not handed out idle for min_idle.
func (s *Source) giveBack(xs []goredis.XMessage) {
	if len(xs) == 0 {
		return
	}
	ids := make([]string, len(xs))
	for i, x := range xs {
		ids[i] = x.ID
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = s.xclaim(ctx, ids, s.c.minIdle) // failed, they come back after min_idle
}

// DeadLetter implements driver.Source: one MULTI/EXEC adds each message
// with its cause and the other bookkeeping fields to the dead-letter
// stream and acknowledges the entries. When it fails nothing is done, and
// the entries come back after min_idle.
func (s *Source) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	ids, err := s.entries(ms)
	if err != nil {
		return err
	}
	defer s.busy.Done()
	tx := s.rdb.TxPipeline()
	for i, m := range ms {
		mark := deadletter.Mark{Cause: deadletter.Cause(causes[i]), Attempt: m.Attempt, Origin: s.stream + "/" + s.c.group + "/" + ids[i], Destination: s.stream, At: time.Now()}
		s.xadd(ctx, tx, s.c.dlq, s.fields(m.Headers, m.ID, m.Key, m.Body, mark.Headers()))
	}
	tx.XAck(ctx, s.stream, s.c.group, ids...)
	if _, err := tx.Exec(ctx); err != nil {
		return fmt.Errorf("redis: dead-lettering %d entries of %s to %s: %w", len(ids), s.stream, s.c.dlq, err)
	}
	return nil
}

// Close implements driver.Source: it sends the XACKs that failed once
// more and closes the client; settling afterwards is stale.
func (s *Source) Close() error {
	s.mu.Lock()
	closed := s.life.Err() != nil
	s.stop()
	s.mu.Unlock()
	if closed {
		return nil
	}
	s.fetch.Lock() // waits for a read under way
	s.fetch.Unlock()
	s.resend.Wait()
	s.busy.Wait() // a call under way gets its answer: what it reports is what happened
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.ackAgain(ctx)
	if err := s.close(); err != nil {
		return fmt.Errorf("redis: closing the source of %s: %w", s.stream, err)
	}
	return nil
}
