package redis

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

// receive receives n messages through r, the Consumer's own flow.
func receive(t *testing.T, r *brokertest.Receiver, n int) []*brokertest.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*brokertest.Delivery
	for len(out) < n {
		d, err := r.Receive(ctx)
		if err != nil {
			t.Fatalf("received %d of %d: %v", len(out), n, err)
		}
		out = append(out, d)
	}
	return out
}

// quiet fails if r delivers anything within d.
func quiet(t *testing.T, r *brokertest.Receiver, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if got, err := r.Receive(ctx); err == nil {
		t.Fatalf("unexpected delivery of entry %s (attempt %d)", driver.MetadataOf(got.Message().Metadata)["messaging.redis.entry_id"], got.Message().Attempt)
	}
}

func publish(t *testing.T, ts testStream, ids ...string) {
	t.Helper()
	var msgs []*driver.Message
	for _, id := range ids {
		msgs = append(msgs, &driver.Message{ID: id, Body: []byte("body of " + id)})
	}
	if err := ts.publishRaw(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

// A Retry leaves the entry pending, never adds it again: XAUTOCLAIM hands
// the same entry out after the delay with the delivery count as its
// attempt, and a poison message reaches MaxAttempts and is parked while
// the stream still holds one entry.
func TestRetryKeepsTheEntryPending(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	r := brokertest.StartReceiver(t, ts.open(t), 0)
	if !r.Traits().DelaysRetry {
		t.Error("Traits.DelaysRetry is false: Redis keeps the delay (an idle time)")
	}
	publish(t, ts, "r-1")
	d := receive(t, r, 1)[0]
	entry := driver.MetadataOf(d.Message().Metadata)["messaging.redis.entry_id"]
	if err := d.Retry(context.Background(), 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if p := ts.pending(t); p[entry] != 1 || len(p) != 1 {
		t.Fatalf("pending after Retry = %v, want %s with delivery count 1", p, entry)
	}
	again := receive(t, r, 1)[0]
	if m := again.Message(); driver.MetadataOf(m.Metadata)["messaging.redis.entry_id"] != entry || m.Attempt != 2 || m.ID != "r-1" {
		t.Fatalf("redelivered entry %s attempt %d id %q, want %s attempt 2 r-1", driver.MetadataOf(m.Metadata)["messaging.redis.entry_id"], m.Attempt, m.ID, entry)
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.Close()

	publish(t, ts, "poison")
	e := brokertest.NewEffects(t)
	var calls int
	c, stop := run(t, e, ts.open(t), func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		calls++
		return errors.New("still failing")
	}, core.WithMaxAttempts(4))
	waitFor(t, 20*time.Second, "the poison message parked", func() bool { return c.Stats().DeadLettered == 1 })
	stop()
	dls, _ := ts.rawDeadLetters(context.Background())
	if calls != 4 || len(dls) != 1 || !strings.Contains(dls[0].Cause, core.ErrMaxAttempts.Error()) {
		t.Errorf("handler ran %d times, parked %+v; want 4 runs and one dead letter naming %q", calls, dls, core.ErrMaxAttempts)
	}
	if n := ts.rdb.XLen(context.Background(), ts.name).Val(); n != 2 {
		t.Errorf("the stream holds %d entries, want the 2 published: a retry added one", n)
	}
	if p := ts.pending(t); len(p) != 0 {
		t.Errorf("pending after parking: %v", p)
	}
}

// The heartbeat keeps a slow handler's entry: another consumer of the
// group polling for idle entries gets nothing while it is held, and its
// delivery count stays 1. Past max_extension the heartbeat lets it go: the
// other consumer reclaims it (attempt 2) and the holder's ack is stale.
func TestHeartbeatKeepsSlowHandlersEntries(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	lease := []Option{WithMinIdle(600 * time.Millisecond)}
	holder := brokertest.StartReceiver(t, ts.open(t, lease...), 0)
	thief := brokertest.StartReceiver(t, ts.open(t, append(lease, WithConsumer("thief"))...), 0)
	publish(t, ts, "slow")
	d := receive(t, holder, 1)[0]
	quiet(t, thief, 2500*time.Millisecond) // four times min_idle
	if p := ts.pending(t); len(p) != 1 || p[driver.MetadataOf(d.Message().Metadata)["messaging.redis.entry_id"]] != 1 {
		t.Errorf("pending while held = %v, want one entry delivered once", p)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatalf("Ack after 2.5s held: %v", err)
	}

	capped := brokertest.StartReceiver(t, ts.open(t, append(lease, WithMaxExtension(time.Second))...), 0)
	publish(t, ts, "slower")
	d = receive(t, capped, 1)[0]
	start := time.Now()
	stolen := receive(t, thief, 1)[0]
	if held := time.Since(start); held < 900*time.Millisecond || stolen.Message().Attempt != 2 {
		t.Errorf("reclaimed after %v with attempt %d, want after max_extension (1s) with attempt 2", held, stolen.Message().Attempt)
	}
	if err := d.Ack(context.Background()); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Errorf("Ack past max_extension = %v, want a stale delivery", err)
	}
	if err := stolen.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Entries deleted (XDEL) or trimmed (XTRIM) from the stream while pending
// are acknowledged when XAUTOCLAIM reports them, not handed out, and leave
// nothing pending.
func TestDeletedPendingEntriesAreAcknowledged(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	ctx := context.Background()
	r := brokertest.StartReceiver(t, ts.open(t), 0)
	publish(t, ts, "kept-1", "deleted", "kept-2")
	ds := receive(t, r, 3)
	for _, d := range ds {
		if d.Message().ID == "deleted" {
			ts.rdb.XDel(ctx, ts.name, driver.MetadataOf(d.Message().Metadata)["messaging.redis.entry_id"])
		}
	}
	r.Close() // gives the three back
	s2 := ts.open(t)
	r2 := brokertest.StartReceiver(t, s2, 0)
	again := receive(t, r2, 2)
	for _, d := range again {
		if id := d.Message().ID; id == "deleted" || d.Message().Attempt != 2 {
			t.Errorf("got %q attempt %d, want the kept ones on attempt 2", id, d.Message().Attempt)
		}
		d.Ack(ctx)
	}
	quiet(t, r2, 300*time.Millisecond)

	publish(t, ts, "trimmed-1", "trimmed-2")
	held := receive(t, r2, 2)
	ts.rdb.XTrimMaxLen(ctx, ts.name, 0)
	lapseLeases(t, s2)
	quiet(t, r2, 500*time.Millisecond)
	if p := ts.pending(t); len(p) != 0 {
		t.Errorf("pending after deletions = %v, want none", p)
	}
	if err := held[0].Ack(ctx); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Errorf("Ack of a trimmed entry after its lease = %v, want stale", err)
	}
}

// DeadLetter adds the dead letter and acknowledges the entry in one
// MULTI/EXEC, and a batch's Ack is one XACK: counted on
// a private server, whose statistics nothing else moves. The dead letter
// carries the message and the bookkeeping fields under driver's names.
func TestDeadLetterIsOneTransactionAndAckBatchOneXACK(t *testing.T) {
	srv := startRedis(t)
	ts := newTestStream(t, "redis://"+srv.addr())
	ctx := context.Background()
	r := brokertest.StartReceiver(t, ts.open(t), 0)
	msgs := []*driver.Message{{ID: "dl-1", Key: "k1", Body: []byte("parked body"), Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "t1"}}}
	for i := range 4 {
		msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("ok-%d", i), Body: []byte("ok")})
	}
	if err := ts.publishRaw(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	ds := receive(t, r, 5)
	ts.rdb.ConfigResetStat(ctx)
	var batch []*brokertest.Delivery
	for _, d := range ds {
		if d.Message().ID == "dl-1" {
			if err := d.DeadLetter(ctx, core.Permanent(errors.New("card declined"))); err != nil {
				t.Fatal(err)
			}
		} else {
			batch = append(batch, d)
		}
	}
	if err := r.AckBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	stats := ts.rdb.Info(ctx, "commandstats").Val()
	for cmd, want := range map[string]int{"multi": 1, "exec": 1, "xadd": 1, "xack": 2} {
		if !strings.Contains(stats, fmt.Sprintf("cmdstat_%s:calls=%d,", cmd, want)) {
			t.Errorf("%s called other than %d times:\n%s", strings.ToUpper(cmd), want, stats)
		}
	}
	if p := ts.pending(t); len(p) != 0 {
		t.Errorf("pending = %v, want none", p)
	}
	xs := ts.rdb.XRange(ctx, ts.name+":dlq", "-", "+").Val()
	if len(xs) != 1 {
		t.Fatalf("dead letters %v, want one", xs)
	}
	f := fields(xs[0])
	entry := driver.MetadataOf(ds[0].Message().Metadata)["messaging.redis.entry_id"]
	for k, want := range map[string]string{
		DefaultIDField: "dl-1", KeyField: "k1", BodyField: "parked body", "tenant": "t1", "traceparent": msgs[0].Headers["traceparent"],
		driver.AttemptHeader: "1", driver.OriginHeader: ts.name + "/g/" + entry, driver.DestinationHeader: ts.name,
	} {
		if f[k] != want {
			t.Errorf("dead letter field %s = %q, want %q", k, f[k], want)
		}
	}
	if !strings.Contains(f[driver.CauseHeader], "card declined") {
		t.Errorf("cause %q", f[driver.CauseHeader])
	}
	if at, err := time.Parse(time.RFC3339Nano, f[driver.ParkedAtHeader]); err != nil || time.Since(at) > time.Minute {
		t.Errorf("parked-at %q: %v", f[driver.ParkedAtHeader], err)
	}
}

// The horizon is unbounded unless the adapter trims by age: then it is
// twice max_age, and the Consumer's retention check names it with the fix.
func TestRetentionAgainstHorizon(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	brokertest.RetentionAgainstHorizon(t, func(t *testing.T) driver.Source { return ts.open(t) }, time.Hour, "unbounded")
	brokertest.RetentionAgainstHorizon(t, func(t *testing.T) driver.Source { return ts.open(t, WithMaxAge(3*time.Hour)) }, time.Hour, "6h0m0s")
}

// A Publisher with max_age trims the entries older than it at each XADD,
// a whole node (100 entries) at a time, as MINID ~ does.
func TestMaxAgeTrims(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	ctx := context.Background()
	past := time.Now().Add(-2 * time.Hour).UnixMilli()
	for i := range 150 {
		ts.rdb.XAdd(ctx, &goredis.XAddArgs{Stream: ts.name, ID: fmt.Sprintf("%d-%d", past, i+1), Values: []any{BodyField, "old"}})
	}
	p, err := NewPublisher(ctx, ts.url("max_age=1h"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Publish(ctx, "", &driver.Message{ID: "new", Body: []byte("new")}); err != nil {
		t.Fatal(err)
	}
	if n := ts.rdb.XLen(ctx, ts.name).Val(); n > 51 {
		t.Errorf("the stream holds %d entries after a publish with max_age, want the first 100 old ones trimmed", n)
	}
}

// A source closed while acks are under way (a process that stops or
// crashes mid-batch) lets each finish: an Ack that returned nil left its
// entry acknowledged, and one that failed left it pending, to come back.
// Were the client closed under a sent XACK, the Ack would fail although
// the server acknowledged the entry.
func TestCloseLetsAcksUnderWayFinish(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	ctx := context.Background()
	const n = 200
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("c-%03d", i)
	}
	publish(t, ts, ids...)
	s := ts.open(t)
	r := brokertest.StartReceiver(t, s, n)
	ds := receive(t, r, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Go(func() { errs[i] = d.Ack(ctx) })
		if i == n/2 {
			wg.Go(func() { s.Close() })
		}
	}
	wg.Wait()
	pending := ts.pending(t)
	acked := 0
	for i, d := range ds {
		_, left := pending[driver.MetadataOf(d.Message().Metadata)["messaging.redis.entry_id"]]
		if errs[i] == nil {
			acked++
		}
		if (errs[i] == nil) == left {
			t.Errorf("%s: Ack returned %v, and the entry is pending: %v", d.Message().ID, errs[i], left)
		}
	}
	t.Logf("%d of %d acked before the close", acked, n)
}
