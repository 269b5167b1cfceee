package redis

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

// readAs makes the stream's entries pending to consumer of group "g", as
// a process that read them and died before it settled them leaves them.
func readAs(t *testing.T, ts testStream, consumer string, n int) {
	t.Helper()
	ctx := context.Background()
	if err := ts.rdb.XGroupCreateMkStream(ctx, ts.name, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	res, err := ts.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{Group: "g", Consumer: consumer, Streams: []string{ts.name, ">"}, Count: int64(n)}).Result()
	if err != nil || len(res) != 1 || len(res[0].Messages) != n {
		t.Fatalf("reading %d entries as %s: %v, %v", n, consumer, res, err)
	}
}

// openDefault opens a Source of group "g" as consumer at default
// settings but for the test's logger.
func openDefault(t *testing.T, ts testStream, consumer string) *Source {
	t.Helper()
	s, err := Open(context.Background(), ts.url(""), WithGroup("g"), WithConsumer(consumer), WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A source that starts under the name of a consumer that died holding
// entries reads them back at once (XREADGROUP … 0), at default settings,
// long before min_idle would let any consumer reclaim them; each comes
// with its delivery count, 2, as its attempt.
func TestRestartReadsItsOwnPendingEntries(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	publish(t, ts, "own-1", "own-2", "own-3")
	readAs(t, ts, "worker", 3)
	s := openDefault(t, ts, "worker")
	r := brokertest.StartReceiver(t, s, 0)
	// Half of the default min_idle: what comes within it was not reclaimed.
	ctx, cancel := context.WithTimeout(context.Background(), s.c.minIdle/2)
	defer cancel()
	for i := range 3 {
		d, err := r.Receive(ctx)
		if err != nil {
			t.Fatalf("received %d of the 3 entries the consumer held before its restart within %v: %v", i, s.c.minIdle/2, err)
		}
		if m := d.Message(); m.Attempt != 2 || string(m.Body) != "body of "+m.ID {
			t.Errorf("entry %s: attempt %d body %q, want attempt 2 and its body", m.ID, m.Attempt, m.Body)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if p := ts.pending(t); len(p) != 0 {
		t.Errorf("pending after the acks: %v", p)
	}
}

// A consumer that dies holding entries loses them to a live consumer of
// its group within 10 s at default settings: the entries' idle time
// reaches min_idle and the live source's next XAUTOCLAIM takes them, with
// attempt 2. The time is counted from the moment the dead consumer read
// them, the latest a heartbeat of its could have reset their idle time.
func TestDeadConsumersEntriesReturnWithin10s(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	publish(t, ts, "dead-1", "dead-2")
	readAs(t, ts, "dead", 2)
	died := time.Now()
	s := openDefault(t, ts, "live")
	r := brokertest.StartReceiver(t, s, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 2 {
		d, err := r.Receive(ctx)
		if err != nil {
			t.Fatalf("received %d of the dead consumer's 2 entries in 20s: %v", i, err)
		}
		if m := d.Message(); m.Attempt != 2 {
			t.Errorf("entry %s: attempt %d, want 2", m.ID, m.Attempt)
		}
		d.Ack(ctx)
	}
	took := time.Since(died)
	t.Logf("the dead consumer's entries returned %v after it read them (min_idle %v)", took.Round(time.Millisecond), s.c.minIdle)
	if took > 10*time.Second {
		t.Errorf("the dead consumer's entries returned after %v, want within 10s", took.Round(time.Millisecond))
	}
}

// A handler slower than min_idle keeps its entry at default settings: the
// heartbeat (XCLAIM to itself, IDLE 0, JUSTID) resets the entry's idle
// time without raising its delivery count, so another consumer of the
// group, running all along, never gets the entry; it is applied once, on
// attempt 1.
func TestSlowHandlerKeepsItsEntryAtDefaults(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	publish(t, ts, "slow")
	e := brokertest.NewEffects(t)
	holder := openDefault(t, ts, "holder")
	slow := 2*holder.c.minIdle + time.Second
	var calls atomic.Int32
	var attempt atomic.Int64
	handling := make(chan struct{})
	c, stop := run(t, e, holder, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if calls.Add(1) == 1 {
			attempt.Store(int64(m.Attempt))
			close(handling)
		}
		time.Sleep(slow)
		return e.Apply(ctx, tx, m)
	})
	<-handling
	var stolen atomic.Int32
	other, stopOther := run(t, e, openDefault(t, ts, "other"), func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		stolen.Add(1)
		return e.Apply(ctx, tx, m)
	})
	waitFor(t, slow+10*time.Second, "the slow handler's commit", func() bool { return c.Stats().Processed == 1 })
	if p := ts.pending(t); len(p) > 1 {
		t.Errorf("pending %v, want at most the one entry", p)
	} else {
		for _, count := range p {
			if count != 1 {
				t.Errorf("delivery count %d after the heartbeats, want 1", count)
			}
		}
	}
	stop()
	stopOther()
	if n, r := stolen.Load(), other.Stats().Received; n != 0 || r != 0 {
		t.Errorf("the other consumer received %d and ran its handler %d times, want neither: the entry was reclaimed from a live consumer", r, n)
	}
	if n := calls.Load(); n != 1 || attempt.Load() != 1 {
		t.Errorf("the slow handler ran %d times, first on attempt %d; want once on attempt 1", n, attempt.Load())
	}
	if counts := e.Counts(t); counts["slow"] != 1 {
		t.Errorf("effects %v, want slow once", counts)
	}
	if p := ts.pending(t); len(p) != 0 {
		t.Errorf("pending after the stop: %v", p)
	}
}

// An acknowledgement that fails because the server is away is sent again
// (every quarter of min_idle) once the server is back: the entry leaves
// the group's pending list without being delivered again, well before
// min_idle.
func TestFailedAckIsSentAgain(t *testing.T) {
	srv := startRedis(t)
	ts := newTestStream(t, "redis://"+srv.addr())
	s, err := Open(context.Background(), ts.url(""), WithGroup("g"), WithConsumer("worker"), WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, s, 0)
	publish(t, ts, "acked")
	d := receive(t, r, 1)[0]
	srv.stop(syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err = d.Ack(ctx)
	cancel()
	if err == nil {
		t.Fatal("Ack succeeded with the server down")
	}
	t.Logf("Ack with the server down: %v", err)
	srv.start()
	back := time.Now()
	waitFor(t, s.c.minIdle/2, "the acknowledgement sent again", func() bool { return len(ts.pending(t)) == 0 })
	t.Logf("acknowledged %v after the server came back", time.Since(back).Round(time.Millisecond))
	quiet(t, r, 300*time.Millisecond)
}

// beats is a Source whose heartbeats (Extend) a test watches: when the
// last one that succeeded began, how many failed, how many are under way.
type beats struct {
	*Source
	mu             sync.Mutex
	good           time.Time
	failed, active int
}

func (b *beats) Extend(ctx context.Context, ms []*driver.Message) error {
	began := time.Now()
	b.mu.Lock()
	b.active++
	b.mu.Unlock()
	err := b.Source.Extend(ctx, ms)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.active--
	if err != nil {
		b.failed++
	} else if began.After(b.good) {
		b.good = began
	}
	return err
}

// Only a heartbeat the server answered extends a lease: while the server
// is away the beats fail, and once the lease (0.9 × min_idle) has passed
// since the last good one began, with none under way, the server comes
// back: the Ack is stale and sends nothing, and the entry comes again,
// attempt 2. The source's lease is what the heartbeat keeps: 0.9 ×
// min_idle, extended up to max_extension.
func TestFailedHeartbeatsDoNotExtend(t *testing.T) {
	srv := startRedis(t)
	ts := newTestStream(t, "redis://"+srv.addr())
	b := &beats{Source: ts.open(t, WithMaxExtension(time.Minute))}
	r := brokertest.StartReceiver(t, b, 0)
	lease := r.Traits().Lease
	if tr := r.Traits(); lease != b.c.minIdle*9/10 || tr.MaxExtension != time.Minute {
		t.Errorf("traits %+v, want a lease of 0.9 × min_idle (%v) extended up to max_extension (1m)", tr, b.c.minIdle*9/10)
	}
	publish(t, ts, "held")
	d := receive(t, r, 1)[0]
	b.mu.Lock()
	b.good = time.Now() // the lease is reckoned from the receipt, before it
	b.mu.Unlock()
	srv.stop(syscall.SIGKILL)
	// A beat that began just before the lease ran out may still be
	// waiting on the server: two seconds more let it fail.
	waitFor(t, lease+10*time.Second, "the lease to run out with every beat failing", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.failed > 0 && b.active == 0 && time.Since(b.good) > lease+2*time.Second
	})
	srv.start()
	if err := d.Ack(context.Background()); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Errorf("Ack after the lease ran out = %v, want a stale delivery", err)
	}
	again := receive(t, r, 1)[0]
	if m := again.Message(); m.ID != "held" || m.Attempt != 2 {
		t.Errorf("got %q attempt %d, want held again on attempt 2", m.ID, m.Attempt)
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// An entry reclaimed by the very source that holds it (the server saw it
// idle for min_idle: a heartbeat came too late) is a new delivery of the
// same entry, and supersedes the one held: that one's Ack is stale and
// sends nothing, the new one settles the entry.
func TestReclaimedCopySupersedesTheHeldOne(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	ctx := context.Background()
	// A long min_idle: no heartbeat resets the entry during the test.
	r := brokertest.StartReceiver(t, ts.open(t, WithMinIdle(20*time.Second)), 0)
	publish(t, ts, "twice")
	held := receive(t, r, 1)[0]
	entry := driver.MetadataOf(held.Message().Metadata)["messaging.redis.entry_id"]
	if err := ts.rdb.Do(ctx, "xclaim", ts.name, "g", "worker", 0, entry, "idle", time.Minute.Milliseconds(), "justid").Err(); err != nil {
		t.Fatal(err)
	}
	again := receive(t, r, 1)[0]
	if m := again.Message(); driver.MetadataOf(m.Metadata)["messaging.redis.entry_id"] != entry || m.Attempt != 2 {
		t.Fatalf("got entry %s attempt %d, want %s again on attempt 2", driver.MetadataOf(m.Metadata)["messaging.redis.entry_id"], m.Attempt, entry)
	}
	if err := held.Ack(ctx); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Errorf("Ack of the superseded delivery = %v, want a stale delivery", err)
	}
	if p := ts.pending(t); p[entry] != 2 {
		t.Errorf("pending %v after the stale Ack, want %s still pending", p, entry)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if p := ts.pending(t); len(p) != 0 {
		t.Errorf("pending %v after the Ack, want none", p)
	}
}

// Extend is XCLAIM to the same consumer with IDLE 0 and JUSTID: the
// entries' idle time starts over and their delivery counts stay; an entry
// no longer pending (deleted from the stream while held) is reported
// stale, alone, in a *driver.Partial.
func TestExtendResetsIdleAndReportsGoneEntriesStale(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	ctx := context.Background()
	s := ts.open(t, WithMinIdle(20*time.Second))
	r := brokertest.StartReceiver(t, s, 0)
	publish(t, ts, "kept", "deleted")
	ds := receive(t, r, 2)
	entry := func(i int) string { return driver.MetadataOf(ds[i].Message().Metadata)["messaging.redis.entry_id"] }
	ts.rdb.Do(ctx, "xclaim", ts.name, "g", "worker", 0, entry(0), "idle", 15000, "justid")
	ts.rdb.XDel(ctx, ts.name, entry(1))
	err := s.Extend(ctx, []*driver.Message{ds[0].Message(), ds[1].Message()})
	var p *driver.Partial
	if !errors.As(err, &p) || len(p.Errs) != 2 || p.Errs[0] != nil || !errors.Is(p.Errs[1], driver.ErrStaleDelivery) {
		t.Fatalf("Extend = %v, want a Partial: nil for the kept entry, stale for the deleted one", err)
	}
	ps, err := ts.rdb.XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: ts.name, Group: "g", Start: "-", End: "+", Count: 10}).Result()
	if err != nil || len(ps) != 1 || ps[0].ID != entry(0) || ps[0].Idle > 10*time.Second || ps[0].RetryCount != 1 {
		t.Errorf("pending after Extend %+v (%v), want the kept entry alone, idle anew, delivered once", ps, err)
	}
	ds[0].Ack(ctx)
}

// When the Consumer stops it releases what it holds: the entries are made
// idle for min_idle, so another consumer of the group reclaims them at
// once (here within 10 s, with a min_idle of 20 s), on attempt 2.
func TestReleaseHandsEntriesBackAtOnce(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	ctx := context.Background()
	lease := WithMinIdle(20 * time.Second)
	holder := brokertest.StartReceiver(t, ts.open(t, lease), 0)
	publish(t, ts, "back-1", "back-2")
	receive(t, holder, 2)
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	other := brokertest.StartReceiver(t, ts.open(t, lease, WithConsumer("other")), 0)
	for _, d := range receive(t, other, 2) { // within 10 s
		if m := d.Message(); m.Attempt != 2 {
			t.Errorf("%s: attempt %d, want 2", m.ID, m.Attempt)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
