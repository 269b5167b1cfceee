package rabbitmq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/sqlite"
)

// proxiedURL rewrites url to go through the proxy.
func proxiedURL(t *testing.T, url string, p *proxy) string {
	t.Helper()
	u, err := parseAMQP(url)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Replace(url, u, p.addr(), 1)
}

// parseAMQP returns the host:port of an amqp URL.
func parseAMQP(url string) (string, error) {
	rest, ok := strings.CutPrefix(url, "amqp://")
	if !ok {
		return "", fmt.Errorf("not an amqp:// URL: %q", url)
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		rest = rest[:i]
	}
	if !strings.Contains(rest, ":") {
		rest += ":5672"
	}
	return rest, nil
}

func publishN(t *testing.T, url, queue, prefix string, n int) []*driver.Message {
	t.Helper()
	pub, err := NewPublisher(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	msgs := make([]*driver.Message, n)
	for i := range msgs {
		msgs[i] = &driver.Message{ID: fmt.Sprintf("%s-%04d", prefix, i), Body: fmt.Appendf(nil, "body %d", i)}
	}
	if err := pub.Publish(context.Background(), queue, msgs...); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// TestReconnectNeverSettlesOldTagsOnNewChannel cuts the connection three
// times while deliveries are in flight. Settling those deliveries must fail
// with ErrStaleDelivery without sending anything: an old tag acked on the
// new channel would either ack the wrong message or make the broker close
// the channel (PRECONDITION_FAILED, unknown delivery tag), which would
// show up as an extra reconnect. Consumption must resume each time, and in
// the end every message is acked and the queue is empty.
func TestReconnectNeverSettlesOldTagsOnNewChannel(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	p := newProxy(t, mustHostPort(t, url))
	ctx := context.Background()
	src, err := Open(ctx, proxiedURL(t, url, p), WithQueue(q), WithLogger(testLogger(t)), WithReconnectBackoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	const n, cuts = 60, 3
	// Room for ten deliveries each round beside the retries the Consumer
	// holds for an hour, one a round.
	r := brokertest.StartReceiver(t, src, 10+cuts)
	publishN(t, url, q, "rc", n)

	acked := map[string]int{}
	staleRefused := 0
	for cut := 1; cut <= cuts; cut++ {
		ds := receiveN(t, r, 10, 20*time.Second)
		// Settle some, keep the rest in flight across the cut.
		for _, d := range ds[:3] {
			if err := d.Ack(ctx); err != nil {
				t.Fatalf("ack before cut: %v", err)
			}
			acked[d.Message().ID]++
		}
		if err := ds[3].Retry(ctx, time.Hour); err != nil { // a pending delayed requeue
			t.Fatalf("retry: %v", err)
		}
		p.cut()
		waitUntil(t, 10*time.Second, func() bool { return src.Stats().Reconnects == int64(cut) })
		// Every in-flight delivery of the dead channel refuses to settle.
		if err := r.AckBatch(ctx, ds[4:7]); !errors.Is(err, core.ErrStaleDelivery) {
			t.Fatalf("AckBatch of stale deliveries = %v, want core.ErrStaleDelivery", err)
		}
		staleRefused += 3
		if err := ds[7].Ack(ctx); !errors.Is(err, core.ErrStaleDelivery) {
			t.Fatalf("Ack of a stale delivery = %v, want core.ErrStaleDelivery", err)
		}
		if err := ds[8].Retry(ctx, 0); !errors.Is(err, core.ErrStaleDelivery) {
			t.Fatalf("Retry of a stale delivery = %v, want core.ErrStaleDelivery", err)
		}
		if err := ds[9].DeadLetter(ctx, errors.New("x")); !errors.Is(err, core.ErrStaleDelivery) {
			t.Fatalf("DeadLetter of a stale delivery = %v, want core.ErrStaleDelivery", err)
		}
		staleRefused += 3
	}
	// Drain the rest on the current channel: everything not acked above
	// (including the stale ones) comes back.
	for len(acked) < n {
		for _, d := range receiveN(t, r, 1, 20*time.Second) {
			if err := d.Ack(ctx); err != nil {
				t.Fatalf("ack after reconnect: %v", err)
			}
			acked[d.Message().ID]++
		}
	}
	st := src.Stats()
	t.Logf("stats: %+v", st)
	if st.Reconnects != cuts {
		t.Errorf("Reconnects = %d, want %d (an extra one means the broker closed a channel)", st.Reconnects, cuts)
	}
	if st.StaleSettlements != int64(staleRefused) {
		t.Errorf("StaleSettlements = %d, want %d", st.StaleSettlements, staleRefused)
	}
	// basic.ack has no reply: an ack written just before a cut can be lost
	// with the connection, and the broker then redelivers that message on
	// the new channel (the dedup store makes it a Duplicate). So an id may
	// be acked twice here, but every one at least once.
	again := 0
	for _, k := range acked {
		if k > 1 {
			again++
		}
	}
	t.Logf("%d of %d ids redelivered after an ack lost in a cut", again, n)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if d := queueDepth(t, url, q); d != 0 {
		t.Errorf("queue holds %d messages after every one was acked", d)
	}
}

func mustHostPort(t *testing.T, url string) string {
	t.Helper()
	hp, err := parseAMQP(url)
	if err != nil {
		t.Fatal(err)
	}
	return hp
}

func waitUntil(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPipelineSurvivesConnectionCuts runs the whole pipeline (SQLite store,
// batches of 20) over a connection cut several times mid-stream, with 20%
// of the messages published twice. Every message's effect must be
// committed exactly once and the queue must end empty: acks lost with a
// dead channel come back as Duplicates.
func TestPipelineSurvivesConnectionCuts(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	p := newProxy(t, mustHostPort(t, url))
	ctx := context.Background()
	src, err := Open(ctx, proxiedURL(t, url, p), WithQueue(q), WithLogger(testLogger(t)), WithReconnectBackoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	const unique = 1000
	msgs := publishN(t, url, q, "cut", unique)
	pub, err := NewPublisher(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(ctx, q, msgs[:unique/5]...); err != nil { // 20% published twice
		t.Fatal(err)
	}
	total := int64(unique + unique/5)

	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "cut.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := store.DB().Exec(`CREATE TABLE effects (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	c, err := core.New[*sql.Tx](src, store, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		// A little work per message so the cuts land mid-stream.
		time.Sleep(200 * time.Microsecond)
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, m.ID)
		return err
	}, core.WithName("cut-test"), core.WithBatchSize(20), core.WithWindow(60), core.WithConcurrency(2),
		core.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	const cuts = 4
	decided := func() int64 { st := c.Stats(); return st.Processed + st.Duplicates }
	for i := 1; i <= cuts; i++ {
		waitUntil(t, 30*time.Second, func() bool { return decided() >= total*int64(i)/(cuts+2) })
		p.cut()
		waitUntil(t, 10*time.Second, func() bool { return src.Stats().Reconnects >= int64(i) })
	}
	// Wait until every id is applied, nothing is ready in the queue and
	// everything received is decided, for a while: acks lost in the cuts
	// bring redeliveries that must be decided (as Duplicates) first.
	stableSince := time.Time{}
	waitUntil(t, 60*time.Second, func() bool {
		var n int
		store.DB().QueryRow(`SELECT count(DISTINCT id) FROM effects`).Scan(&n)
		st := c.Stats()
		quiet := n == unique && st.Received == st.Processed+st.Duplicates && queueDepth(t, url, q) == 0
		if !quiet {
			stableSince = time.Time{}
			return false
		}
		if stableSince.IsZero() {
			stableSince = time.Now()
		}
		return time.Since(stableSince) > 300*time.Millisecond
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	st, sst := c.Stats(), src.Stats()
	t.Logf("consumer: %+v; source: %+v", st, sst)
	var applied, distinct int
	if err := store.DB().QueryRow(`SELECT count(*), count(DISTINCT id) FROM effects`).Scan(&applied, &distinct); err != nil {
		t.Fatal(err)
	}
	if applied != unique || distinct != unique {
		t.Errorf("effects: %d rows for %d ids, want exactly %d each once", applied, distinct, unique)
	}
	if st.Processed != unique {
		t.Errorf("Processed = %d, want %d", st.Processed, unique)
	}
	if sst.Reconnects < cuts {
		t.Errorf("Reconnects = %d, want >= %d", sst.Reconnects, cuts)
	}
	// A redelivery still on its way to the consumer when it stopped is
	// back in the queue; it must be a copy of an applied message, so a
	// next consumer would decide Duplicate.
	for _, d := range drainQueue(t, url, q) {
		var n int
		store.DB().QueryRow(`SELECT count(*) FROM effects WHERE id = ?`, d.MessageId).Scan(&n)
		if n != 1 {
			t.Errorf("left in the queue: %s, applied %d times", d.MessageId, n)
		}
	}
	if d := queueDepth(t, url, q+".dlq"); d != 0 {
		t.Errorf("dead-letter queue holds %d messages", d)
	}
}

// TestReconnectWhileBrokerIsDown keeps the broker unreachable for a while
// after a cut: the Source retries with backoff, Receive reports the
// trouble, and consumption resumes once the broker is back.
func TestReconnectWhileBrokerIsDown(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	p := newProxy(t, mustHostPort(t, url))
	ctx := context.Background()
	src, err := Open(ctx, proxiedURL(t, url, p), WithQueue(q), WithLogger(testLogger(t)), WithReconnectBackoff(20*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, src, 0)
	publishN(t, url, q, "down", 10)
	first := receiveN(t, r, 1, 10*time.Second)[0]
	if err := first.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	p.setDown(true)
	p.cut()
	// Until the client notices the cut, a delivery already on its way can
	// still be handed out (its settlement then fails as stale).
	waitUntil(t, 5*time.Second, func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.sess == nil
	})
	// While down, Receive returns the connection errors (the Consumer logs
	// them and calls again) and no delivery.
	rctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	reported := 0
	for rctx.Err() == nil {
		d, err := r.Receive(rctx)
		if err == nil {
			t.Fatalf("received %q while the broker was down", d.Message().ID)
		}
		if rctx.Err() == nil {
			reported++
		}
	}
	cancel()
	if reported == 0 {
		t.Error("Receive reported no error while the broker was unreachable")
	}
	if n := src.Stats().Reconnects; n != 0 {
		t.Fatalf("Reconnects = %d while the broker was down", n)
	}
	p.setDown(false)
	got := map[string]bool{}
	for len(got) < 9 {
		d := receiveN(t, r, 1, 10*time.Second)[0]
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		got[d.Message().ID] = true
	}
	if n := src.Stats().Reconnects; n != 1 {
		t.Errorf("Reconnects = %d, want 1", n)
	}
	t.Logf("%d connection errors reported while down", reported)
}

// TestReconnectPromptAfterOutage keeps the broker unreachable for a few
// seconds, twice, with the default reconnect backoff: no wait between
// reconnect rounds exceeds the default cap (2s), so consumption resumes
// within about one cap of the broker being back, and the backoff starts
// over after the reconnect, so the second outage is retried quickly again.
func TestReconnectPromptAfterOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a 5s outage skipped with -short")
	}
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	p := newProxy(t, mustHostPort(t, url))
	ctx := context.Background()
	src, err := Open(ctx, proxiedURL(t, url, p), WithQueue(q), WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, src, 0)
	const cap = 2 * time.Second // defaultConfig's backoffMax
	if c := defaultConfig(q); c.backoffMax != cap {
		t.Fatalf("default reconnect cap %v, this test assumes %v", c.backoffMax, cap)
	}
	publishN(t, url, q, "prompt", 20)
	if err := receiveN(t, r, 1, 10*time.Second)[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	outage := func(n int, d time.Duration) (refused []time.Time, recovery time.Duration) {
		t.Helper()
		p.setDown(true)
		p.cut()
		from := len(p.refusals())
		waitUntil(t, 5*time.Second, func() bool {
			src.mu.Lock()
			defer src.mu.Unlock()
			return src.sess == nil
		})
		time.Sleep(d)
		p.setDown(false)
		back := time.Now()
		refused = p.refusals()[from:]
		// Deliveries handed out before the cut was noticed are stale;
		// wait for one that settles.
		for {
			dl := receiveN(t, r, 1, 30*time.Second)[0]
			if err := dl.Ack(ctx); err == nil {
				break
			}
		}
		recovery = time.Since(back)
		if got := src.Stats().Reconnects; got != int64(n) {
			t.Errorf("Reconnects = %d after outage %d", got, n)
		}
		return refused, recovery
	}
	gaps := func(ts []time.Time) []time.Duration {
		var g []time.Duration
		for i := 1; i < len(ts); i++ {
			g = append(g, ts[i].Sub(ts[i-1]).Round(time.Millisecond))
		}
		return g
	}
	refused, recovery := outage(1, 5*time.Second)
	t.Logf("outage 1 (5s): %d refused dials, gaps %v; consuming again %v after the broker was back", len(refused), gaps(refused), recovery.Round(time.Millisecond))
	if len(refused) < 4 {
		t.Fatalf("%d dials during a 5s outage, want the quick first retries", len(refused))
	}
	for _, g := range gaps(refused) {
		// ±20% jitter never exceeds the cap; the slack is for scheduling.
		if g > cap+time.Second {
			t.Errorf("a reconnect round waited %v, above the %v cap", g, cap)
		}
	}
	refused, recovery = outage(2, 3*time.Second)
	t.Logf("outage 2 (3s): %d refused dials, gaps %v; consuming again %v after the broker was back", len(refused), gaps(refused), recovery.Round(time.Millisecond))
	// Had the backoff not started over, the first retries would wait the
	// cap; started over, they come after 100ms, 200ms, ….
	if len(refused) < 3 || refused[2].Sub(refused[0]) > cap {
		t.Errorf("after a reconnect the backoff did not start over: refused dials %v apart", gaps(refused))
	}
}

// TestMultiNodeURLFailover runs a Source and a Publisher on a two-node URL
// whose nodes are proxies of the one broker: with the first node down both
// open on the second, whichever node they try first, and when the second
// goes down and the first comes back the Source reconnects to the first.
func TestMultiNodeURLFailover(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	a, b := newProxy(t, mustHostPort(t, url)), newProxy(t, mustHostPort(t, url))
	multi := strings.Replace(proxiedURL(t, url, a), a.addr(), a.addr()+","+b.addr(), 1)
	ctx := context.Background()
	a.setDown(true)
	for range 4 { // the first node is picked at random
		pub, err := NewPublisher(ctx, multi, WithRoutingKey(q))
		if err != nil {
			t.Fatalf("NewPublisher with node 1 of 2 down: %v", err)
		}
		pub.Close()
	}
	// The same through core's URL openers, as a deployment configures it.
	cpub, err := core.OpenPublisher(ctx, multi+"?queue="+q)
	if err != nil {
		t.Fatalf("core.OpenPublisher with node 1 of 2 down: %v", err)
	}
	cpub.Close()
	src, err := Open(ctx, multi, WithQueue(q), WithLogger(testLogger(t)))
	if err != nil {
		t.Fatalf("Open with node 1 of 2 down: %v", err)
	}
	r := brokertest.StartReceiver(t, src, 0)
	node := func() string {
		src.mu.Lock()
		defer src.mu.Unlock()
		if src.sess == nil {
			return ""
		}
		return src.sess.conn.RemoteAddr().String()
	}
	publishN(t, url, q, "multi", 10)
	if err := receiveN(t, r, 1, 10*time.Second)[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if got := node(); got != b.addr() {
		t.Fatalf("Source on %q, want node 2 %s (node 1 is down)", got, b.addr())
	}
	a.setDown(false)
	b.setDown(true)
	b.cut()
	waitUntil(t, 10*time.Second, func() bool { return node() == a.addr() })
	got := map[string]bool{}
	for len(got) < 9 {
		d := receiveN(t, r, 1, 10*time.Second)[0]
		if d.Ack(ctx) == nil {
			got[d.Message().ID] = true
		}
	}
	if n := src.Stats().Reconnects; n != 1 {
		t.Errorf("Reconnects = %d, want 1", n)
	}
	if n := len(b.refusals()); n != 0 {
		t.Errorf("node 2 was dialled %d times while down: the Source should have moved to node 1 at once", n)
	}
}
