//go:build faults

package rabbitmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/retry"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
)

// TestFaultRabbitMQCluster runs a private 3-node RabbitMQ cluster and,
// on it, first a Consumer over Postgres through the loss of the node it is
// connected to and then of its quorum queue's leader, then a Publisher
// through the loss of its node.
func TestFaultRabbitMQCluster(t *testing.T) {
	pgURL := postgresURL(t)
	c := servicetest.StartRabbitCluster(t, 3)
	t.Run("NodeLoss", func(t *testing.T) { clusterNodeLoss(t, c, pgURL) })
	t.Run("PublisherFailover", func(t *testing.T) { clusterPublisherFailover(t, c) })
}

// clusterQueue returns a fresh queue name for the cluster.
func clusterQueue() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "idemq-cluster-" + hex.EncodeToString(b)
}

// runningNode returns the index of a running node of c.
func runningNode(t *testing.T, c *servicetest.RabbitCluster) int {
	t.Helper()
	for i := range c.Len() {
		if c.Running(i) {
			return i
		}
	}
	t.Fatal("no node is running")
	return -1
}

// sourceNode returns the node the Source's current session is connected
// to, -1 while it has none.
func sourceNode(c *servicetest.RabbitCluster, src *Source) int {
	src.mu.Lock()
	defer src.mu.Unlock()
	if src.sess == nil || src.sess.conn.IsClosed() {
		return -1
	}
	return c.Index(src.sess.conn.RemoteAddr().String())
}

// clusterNodeLoss publishes 5,000 orders plus 20% re-published copies
// through the cluster URL into a quorum queue with a delivery limit, and
// consumes them into Postgres with one Consumer, never restarted, whose
// handler inserts an effect row (an amount for an account) in a table
// without a unique key. While it consumes, the test kills the node the
// Consumer is connected to, restarts it, then kills the queue's leader and
// restarts it. Every id's effect must be committed exactly once (or the
// message dead-lettered with a cause), the balances must be exact and the
// queue empty.
func clusterNodeLoss(t *testing.T, c *servicetest.RabbitCluster, pgURL string) {
	ctx := context.Background()
	q := clusterQueue()
	suffix := q[len("idemq-cluster-"):]
	effects, dedup := "cluster_effects_"+suffix, "cluster_processed_"+suffix
	store, err := postgres.Open(ctx, pgURL, postgres.WithTable(dedup))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	pool := store.Pool()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (id TEXT NOT NULL, account TEXT NOT NULL, amount BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+effects+`, `+dedup) })

	srcURL := c.URL() + "?queue=" + q + "&queue_type=quorum&delivery_limit=5&connection_name=cluster-consumer"
	logs := &servicetest.Buffer{}
	src, err := Open(ctx, srcURL, WithLogger(testLoggerTo(t, logs)))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()

	const unique, accounts = 5000, 17
	msgs := make([]*driver.Message, 0, unique*6/5)
	want := map[string]int64{}
	for i := range unique {
		acct, amount := fmt.Sprintf("acct-%02d", i%accounts), int64(1+mrand.IntN(1000))
		want[acct] += amount
		msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("order-%05d", i), Body: fmt.Appendf(nil, "%s %d", acct, amount)})
	}
	for _, i := range mrand.Perm(unique)[:unique/5] {
		msgs = append(msgs, msgs[i])
	}
	mrand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	pub, err := NewPublisher(ctx, c.URL(), WithRoutingKey(q))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := pub.Publish(ctx, "", msgs...); err != nil {
		t.Fatal(err)
	}
	pub.Close()
	t.Logf("published %d messages (%d ids) in %v", len(msgs), unique, time.Since(start).Round(time.Millisecond))

	const window = 50
	// About 100 messages a second, so that the faults land mid-stream.
	handler := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		var acct string
		var amount int64
		if _, err := fmt.Sscan(string(m.Body), &acct, &amount); err != nil {
			return core.Permanent(err)
		}
		if !retry.Sleep(ctx, 8*time.Millisecond) {
			return ctx.Err()
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (id, account, amount) VALUES ($1, $2, $3)`, m.ID, acct, amount)
		return err
	}
	cons, err := core.New[pgx.Tx](src, store, handler, core.WithName("cluster-"+suffix),
		core.WithBatchSize(10), core.WithWindow(window), core.WithConcurrency(1), core.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()
	rows := func() int {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM `+effects).Scan(&n)
		return n
	}

	// kill stops node i and returns how long until an effect of a message
	// delivered after the stop committed: when the Source was on node i,
	// one committed after it reconnected; else one beyond the window of
	// messages the Consumer may have held when the node stopped.
	kill := func(i int, what string) time.Duration {
		t.Helper()
		before := src.Stats().Reconnects
		own := sourceNode(c, src) == i
		base := rows()
		t.Logf("stopping node %d (%s), %s; the Source is on node %d; %d effect rows so far", i, c.NodeName(i), what, sourceNode(c, src), base)
		stopped := time.Now()
		c.Stop(i)
		if own {
			servicetest.WaitFor(t, 60*time.Second, "the Source to reconnect", func() bool {
				base = rows()
				return src.Stats().Reconnects > before && sourceNode(c, src) >= 0
			})
		} else {
			base += window
		}
		servicetest.WaitFor(t, 60*time.Second, "an effect of a message delivered after the stop", func() bool { return rows() > base })
		rec := time.Since(stopped)
		t.Logf("node %d stopped: the Source is on node %d (reconnects %d); an effect of a message delivered after the stop committed %v after it",
			i, sourceNode(c, src), src.Stats().Reconnects, rec.Round(time.Millisecond))
		return rec
	}

	servicetest.WaitFor(t, 60*time.Second, "500 effects", func() bool { return rows() >= 500 })
	first := -1
	servicetest.WaitFor(t, 10*time.Second, "the Source's node", func() bool { first = sourceNode(c, src); return first >= 0 })
	rec1 := kill(first, "the consumer's node")
	c.Start(first)
	t.Logf("node %d restarted; %d effect rows", first, rows())

	leader := -1
	servicetest.WaitFor(t, 30*time.Second, "the queue's leader", func() bool { leader = c.QueueLeader(q); return leader >= 0 })
	if n := rows(); n >= unique-500 {
		t.Fatalf("%d of %d effects already applied before the second fault: the consumer runs too fast for this test", n, unique)
	}
	rec2 := kill(leader, "the queue's leader")
	c.Start(leader)
	t.Logf("node %d restarted; %d effect rows", leader, rows())

	// Drain: every id applied, nothing in flight, the queue empty, stably.
	depth := func() int {
		ch, closeCh := dialChannel(t, c.NodeURL(runningNode(t, c)))
		defer closeCh()
		qi, err := ch.QueueDeclarePassive(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		if err != nil {
			t.Fatalf("inspect %s: %v", q, err)
		}
		return qi.Messages
	}
	distinct := func() int {
		var n int
		pool.QueryRow(ctx, `SELECT count(DISTINCT id) FROM `+effects).Scan(&n)
		return n
	}
	stableSince := time.Time{}
	servicetest.WaitFor(t, 150*time.Second, "every id applied and the queue empty", func() bool {
		st := cons.Stats()
		if distinct() != unique || st.Received != st.Processed+st.Duplicates+st.DeadLettered || depth() != 0 {
			stableSince = time.Time{}
			return false
		}
		if stableSince.IsZero() {
			stableSince = time.Now()
		}
		return time.Since(stableSince) > 500*time.Millisecond
	})
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
	done <- nil // for the deferred stop
	elapsed := time.Since(start)

	var total, ids, doubled int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM `+effects).Scan(&total, &ids); err != nil {
		t.Fatal(err)
	}
	pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT id FROM `+effects+` GROUP BY id HAVING count(*) > 1) d`).Scan(&doubled)
	got := map[string]int64{}
	r, err := pool.Query(ctx, `SELECT account, sum(amount) FROM `+effects+` GROUP BY account`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var a string
		var s int64
		r.Scan(&a, &s)
		got[a] = s
	}
	r.Close()
	dead := drainQueue(t, c.NodeURL(runningNode(t, c)), q+".dlq")
	withCause := 0
	for _, d := range dead {
		if d.Headers["idemq-cause"] != nil || d.Headers["x-death"] != nil {
			withCause++
		}
		t.Logf("dead letter %s: cause %v, x-death %v", d.MessageId, d.Headers["idemq-cause"], d.Headers["x-death"])
	}
	lost := unique - ids - withCause
	st, sst := cons.Stats(), src.Stats()
	t.Logf("consumer %+v; source %+v; %d effect rows for %d ids in %v", st, sst, total, ids, elapsed.Round(time.Millisecond))
	t.Logf("FAULT-MATRIX | rabbitmq cluster: stop the consumer's node, then the queue leader | rabbitmq (3 nodes, quorum) | postgres | messages=%d lost=%d doubled=%d recovery=%v,%v",
		len(msgs), lost, doubled, rec1.Round(time.Millisecond), rec2.Round(time.Millisecond))

	if total != unique || ids != unique || doubled != 0 {
		t.Errorf("effects: %d rows for %d ids (%d ids more than once), want each of %d ids exactly once", total, ids, doubled, unique)
	}
	for a, w := range want {
		if got[a] != w {
			t.Errorf("balance of %s = %d, want %d", a, got[a], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d accounts have effects, want %d", len(got), len(want))
	}
	if lost != 0 {
		t.Errorf("%d ids neither applied nor dead-lettered with a cause", lost)
	}
	if len(dead) != withCause {
		t.Errorf("%d of %d dead letters carry no cause", len(dead)-withCause, len(dead))
	}
	if st.Processed != unique {
		t.Errorf("Processed = %d, want %d", st.Processed, unique)
	}
	if st.Duplicates < unique/5 {
		t.Errorf("Duplicates = %d, want at least the %d re-published copies", st.Duplicates, unique/5)
	}
	if sst.Reconnects < 1 {
		t.Errorf("Reconnects = %d, want at least 1", sst.Reconnects)
	}
	if d := depth(); d != 0 {
		t.Errorf("queue holds %d messages after the Consumer stopped", d)
	}
	if strings.Contains(logs.String(), "guest:guest") {
		t.Errorf("the Source logged a password:\n%s", logs.String())
	}
}

// clusterPublisherFailover publishes through the cluster URL, kills the
// node the Publisher is connected to, and publishes again: the Publisher
// moves to another node, and every message reaches the quorum queue.
func clusterPublisherFailover(t *testing.T, c *servicetest.RabbitCluster) {
	ctx := context.Background()
	for i := range c.Len() {
		if !c.Running(i) { // left stopped by a failed NodeLoss
			c.Start(i)
		}
	}
	q := clusterQueue()
	src, err := Open(ctx, c.URL()+"?queue="+q+"&queue_type=quorum", WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	src.Close()
	// A node NodeLoss restarted may not be a working member of the new
	// queue yet: stopping another then leaves the queue without a quorum,
	// and every publish is nacked until the stopped node returns.
	servicetest.WaitFor(t, time.Minute, "every member of the quorum queue online", func() bool {
		out, err := c.Ctl(0, "list_queues", "-q", "--no-table-headers", "name", "online")
		if err != nil {
			return false
		}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == q {
				return strings.Count(line, "@") == c.Len()
			}
		}
		return false
	})
	leader := -1
	servicetest.WaitFor(t, 30*time.Second, "the queue's leader", func() bool { leader = c.QueueLeader(q); return leader >= 0 })
	var pub *Publisher
	pubNode := func() int {
		pub.mu.Lock()
		defer pub.mu.Unlock()
		if pub.conn == nil || pub.conn.IsClosed() {
			return -1
		}
		return c.Index(pub.conn.RemoteAddr().String())
	}
	// The Publisher starts on a node other than the queue's leader: the
	// stop then leaves the leader and a follower, a quorum with nothing
	// to elect, so what is tested is the Publisher's move. (The loss of
	// the leader is NodeLoss's; an election under the fault run's load
	// nacked every publish for over 30 s.) The first node a Publisher
	// dials is picked at random.
	for tries := 0; ; tries++ {
		p, err := NewPublisher(ctx, c.URL(), WithRoutingKey(q))
		if err != nil {
			t.Fatal(err)
		}
		pub = p
		if n := pubNode(); n >= 0 && n != leader {
			break
		}
		p.Close()
		if tries == 50 {
			t.Fatalf("50 Publishers all opened on the queue's leader, node %d", leader)
		}
	}
	defer pub.Close()
	batch := func(from, n int) []*driver.Message {
		ms := make([]*driver.Message, n)
		for i := range ms {
			ms[i] = &driver.Message{ID: fmt.Sprintf("pub-%04d", from+i), Body: []byte("x")}
		}
		return ms
	}
	if err := pub.Publish(ctx, "", batch(0, 100)...); err != nil {
		t.Fatal(err)
	}
	before := pubNode()
	c.Stop(before)
	// A Publish may fail while the Publisher learns that its connection
	// died, or be nacked while the queue's members notice the stop; the
	// caller retries the call after a pause, as a producer would (the
	// consumer's dedup absorbs a copy published twice).
	attempts := 0
	for {
		attempts++
		err := pub.Publish(ctx, "", batch(100, 100)...)
		if err == nil {
			break
		}
		t.Logf("publish attempt %d after the stop: %v", attempts, err)
		if attempts%25 == 0 {
			for i := range c.Len() {
				if c.Running(i) {
					out, err := c.Ctl(i, "list_queues", "-q", "--no-table-headers", "name", "leader", "members", "online")
					t.Logf("node %d lists the queues: %s %v", i, strings.TrimSpace(out), err)
				}
			}
		}
		if attempts == 150 { // 30 s on a busy 2-core machine
			t.Fatalf("Publish still fails after %d attempts", attempts)
		}
		time.Sleep(200 * time.Millisecond)
	}
	after := pubNode()
	t.Logf("Publisher moved from node %d to node %d (%d attempts; the queue's leader is node %d)", before, after, attempts, leader)
	if after < 0 || after == before {
		t.Errorf("Publisher on node %d after node %d stopped", after, before)
	}
	// A Publisher opened while a node is down finds a live one, whichever
	// node it starts at.
	for range 4 {
		p2, err := NewPublisher(ctx, c.URL(), WithRoutingKey(q))
		if err != nil {
			t.Fatalf("NewPublisher with node %d down: %v", before, err)
		}
		p2.Close()
	}
	c.Start(before)
	got := map[string]bool{}
	for _, d := range drainQueue(t, c.NodeURL(before), q) {
		got[d.MessageId] = true
	}
	if len(got) != 200 {
		t.Errorf("%d distinct ids in the queue, want 200", len(got))
	}
	ch := testChannel(t, c.NodeURL(before))
	for _, n := range []string{q, q + ".dlq"} {
		ch.QueueDelete(n, false, false, false)
	}
}

// testLoggerTo logs to the test and to buf.
func testLoggerTo(t testing.TB, buf *servicetest.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{t}, buf), &slog.HandlerOptions{Level: slog.LevelInfo}))
}
