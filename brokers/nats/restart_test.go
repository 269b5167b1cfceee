package nats

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// TestServerRestart restarts a private nats-server twice while a Consumer
// with the SQLite store works through 2,000 messages, 400 of them second
// copies of an id: every id's effect is committed exactly once, and the
// Consumer recovers by itself.
func TestServerRestart(t *testing.T) {
	srv := servicetest.StartNATS(t, "")
	ts := newTestStream(t, srv.URL)
	ctx := ctxFor(t, 2*time.Minute)
	const unique, dups = 1600, 400
	var first, second []*driver.Message
	for i := range unique {
		m := &driver.Message{ID: fmt.Sprintf("r-%04d", i), Body: fmt.Appendf(nil, `{"n":%d}`, i)}
		first = append(first, m)
		if i%(unique/dups) == 0 {
			second = append(second, m)
		}
	}
	p, err := NewPublisher(ctx, ts.addr())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(ctx, "", first...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	p.Close()
	// The second copies carry the id in idemq-id, so JetStream keeps them.
	if err := ts.publishRaw(ctx, IDHeader, second...); err != nil {
		t.Fatal(err)
	}

	e := brokertest.NewEffects(t)
	src := openSource(t, ts, WithAckWait(2*time.Second))
	c, stop := run(t, e, src, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		time.Sleep(time.Millisecond)
		return e.Apply(ctx, tx, m)
	}, core.WithName("restart"), core.WithBatchSize(10), core.WithWindow(50), core.WithConcurrency(2),
		core.WithBackoff(core.ConstantBackoff(50*time.Millisecond)))
	applied := func() int { return len(e.Counts(t)) }
	for _, at := range []int{unique / 4, unique / 2} {
		servicetest.WaitFor(t, time.Minute, fmt.Sprintf("%d ids applied", at), func() bool { return applied() >= at })
		stopped := time.Now()
		srv.Restart()
		before := applied()
		t.Logf("restarted the server with %d ids applied; stats %+v", before, c.Stats())
		servicetest.WaitFor(t, time.Minute, "an effect after the restart", func() bool { return applied() > before })
		// Recovery as the fault matrix (docs/production.md) counts it: from the stop to
		// the next committed effect.
		t.Logf("recovery: %v from the stop to the next committed effect", time.Since(stopped).Round(10*time.Millisecond))
	}
	servicetest.WaitFor(t, time.Minute, "every id applied", func() bool { return applied() == unique })
	// Let redeliveries of messages whose ack was lost arrive and be decided.
	time.Sleep(3 * time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for id, n := range e.Counts(t) {
		if n != 1 {
			t.Errorf("%s applied %d times", id, n)
		}
	}
	stats := c.Stats()
	t.Logf("stats %+v", stats)
	if stats.Processed != unique || stats.Duplicates < dups {
		t.Errorf("Processed %d, Duplicates %d; want %d and at least %d", stats.Processed, stats.Duplicates, unique, dups)
	}
}

// TestSettleAfterReconnect: a server restart by itself leaves deliveries
// settleable (JetStream keeps the consumer's state; the client
// reconnects); one whose AckWait passed while the server was down is stale
// and comes back.
func TestSettleAfterReconnect(t *testing.T) {
	srv := servicetest.StartNATS(t, "")
	ts := newTestStream(t, srv.URL)
	ctx := ctxFor(t, time.Minute)
	s, r := receiver(t, ts, WithAckWait(3*time.Second))
	if err := ts.publishRaw(ctx, IDHeader, &driver.Message{ID: "a", Body: []byte("a")}, &driver.Message{ID: "b", Body: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	a, b := receiveOne(t, r, 5*time.Second), receiveOne(t, r, 5*time.Second)
	srv.Restart()
	servicetest.WaitFor(t, 10*time.Second, "the source to reconnect", s.link.nc.IsConnected)
	if err := a.Ack(ctx); err != nil {
		t.Fatalf("Ack after the reconnect: %v", err)
	}
	srv.Stop()
	// b's lease lapses while the server is down: no extension can be
	// confirmed before it (one confirmed after it, by the restarted server,
	// does not count), so it lapses at most an AckWait after the stop.
	lapsed := time.Now().Add(s.ackWait + 100*time.Millisecond)
	servicetest.WaitFor(t, 10*time.Second, "b's lease to lapse", func() bool { return time.Now().After(lapsed) })
	srv.Start()
	// The Ack comes once the client is back and has had the answers to
	// what it buffered meanwhile (a heartbeat's InProgress and flush).
	servicetest.WaitFor(t, 10*time.Second, "the source to reconnect", s.link.nc.IsConnected)
	if err := s.link.nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.Ack(ctx); !errors.Is(err, core.ErrStaleDelivery) {
		t.Fatalf("Ack after the AckWait passed offline = %v, want a stale error", err)
	}
	// b comes back. So may a: the server keeps a consumer's acks on disk
	// lazily, and one stopped right after an ack may redeliver the
	// message, which the dedup store then decides Duplicate.
	for {
		again := receiveOne(t, r, 15*time.Second)
		if err := again.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		if again.Message().ID == "b" {
			break
		}
		t.Logf("%q redelivered after the server stopped", again.Message().ID)
	}
	expectNothing(t, r, time.Second)
}

// TestHeartbeatConfirmedAfterLapse: while the server is down, Extend
// reports failure (its InProgress only waits in the client's buffer), and
// an InProgress the restarted server confirms only after the delivery's
// AckWait passed is no extension (the server may have read it after it
// gave up on the delivery): the delivery is stale and the message comes
// back.
func TestHeartbeatConfirmedAfterLapse(t *testing.T) {
	srv := servicetest.StartNATS(t, "")
	ts := newTestStream(t, srv.URL)
	ctx := ctxFor(t, time.Minute)
	// Extensions every 2s, each flush waiting up to 3s: one sent before
	// the lapse is still waiting when the server comes back after it.
	s, r := receiver(t, ts, WithAckWait(6*time.Second))
	if err := ts.publishRaw(ctx, IDHeader, &driver.Message{ID: "b", Body: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	b := receiveOne(t, r, 5*time.Second)
	srv.Stop()
	lapsed := time.Now().Add(s.ackWait + 100*time.Millisecond) // nothing confirmed after the stop
	if err := s.Extend(ctxFor(t, time.Second), []*driver.Message{b.Message()}); err == nil {
		t.Fatal("Extend with the server down succeeded")
	}
	servicetest.WaitFor(t, 10*time.Second, "the lease to lapse", func() bool { return time.Now().After(lapsed) })
	srv.Start()
	servicetest.WaitFor(t, 10*time.Second, "the source to reconnect", s.link.nc.IsConnected)
	if err := s.link.nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.Ack(ctx); !errors.Is(err, core.ErrStaleDelivery) {
		t.Fatalf("Ack after an extension confirmed past the lapse = %v, want a stale error", err)
	}
	again := receiveOne(t, r, 15*time.Second)
	if again.Message().ID != "b" {
		t.Fatalf("redelivered %q, want b", again.Message().ID)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
