package kafka

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
)

// postgresURL returns the Postgres URL from IDEMQ_POSTGRES_URL (default the
// local server); unreachable skips, or fails with IDEMQ_REQUIRE_SERVICES=1.
func postgresURL(t testing.TB) string {
	t.Helper()
	return servicetest.PostgresURL(t)
}

// pgEffects is a Postgres dedup store plus an effects table without a
// unique key, so an effect applied twice is counted twice.
type pgEffects struct {
	store   *postgres.Store
	effects string
}

func newPGEffects(t testing.TB) *pgEffects {
	t.Helper()
	url := postgresURL(t)
	ctx := context.Background()
	suffix := randomHex(5)
	table := "kafka_processed_" + suffix
	st, err := postgres.Open(ctx, url, postgres.WithTable(table))
	if err != nil {
		t.Fatalf("postgres store: %v", err)
	}
	e := &pgEffects{store: st, effects: "kafka_effects_" + suffix}
	if _, err := st.Pool().Exec(ctx, `CREATE TABLE `+e.effects+` (id TEXT NOT NULL, body TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = st.Pool().Exec(context.Background(), `DROP TABLE IF EXISTS `+e.effects+`, `+table)
		st.Close()
	})
	return e
}

func (e *pgEffects) apply(ctx context.Context, tx pgx.Tx, m *core.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+e.effects+` (id, body) VALUES ($1, $2)`, m.ID, string(m.Body))
	return err
}

// counts returns the rows and distinct ids in the effects table.
func (e *pgEffects) counts(t testing.TB) (rows, ids int) {
	t.Helper()
	if err := e.store.Pool().QueryRow(context.Background(), `SELECT count(*), count(DISTINCT id) FROM `+e.effects).Scan(&rows, &ids); err != nil {
		t.Fatal(err)
	}
	return rows, ids
}

// twice returns ids applied more than once.
func (e *pgEffects) twice(t testing.TB, pool *pgxpool.Pool) []string {
	rows, err := pool.Query(context.Background(), `SELECT id FROM `+e.effects+` GROUP BY id HAVING count(*) > 1 ORDER BY id LIMIT 20`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// consumer is a core.Consumer over a Kafka Source running in the
// background.
type consumer struct {
	name string
	src  *Source
	c    *core.Consumer[pgx.Tx]
	stop context.CancelFunc
	done chan error
}

func startConsumer(t testing.TB, src driver.Source, e *pgEffects, h core.Handler[pgx.Tx], opts ...core.Option) *consumer {
	t.Helper()
	if h == nil {
		h = e.apply
	}
	c, err := core.New[pgx.Tx](src, e.store, h, append(consumerOptions(t), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return runConsumer(t, src, c)
}

// startBatchConsumer runs a NewBatch consumer of src into e's store with
// the tests' options and opts.
func startBatchConsumer(t testing.TB, src driver.Source, e *pgEffects, h core.BatchHandler[pgx.Tx], opts ...core.Option) *consumer {
	t.Helper()
	c, err := core.NewBatch[pgx.Tx](src, e.store, h, append(consumerOptions(t), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return runConsumer(t, src, c)
}

// consumerOptions are the options every test consumer starts with.
func consumerOptions(t testing.TB) []core.Option {
	return []core.Option{
		core.WithName("kafka-e2e"),
		core.WithBackoff(core.ConstantBackoff(20 * time.Millisecond)),
		core.WithShutdownTimeout(5 * time.Second),
		core.WithLogger(testLogger(t)),
	}
}

// runConsumer runs c until the test ends.
func runConsumer(t testing.TB, src driver.Source, c *core.Consumer[pgx.Tx]) *consumer {
	ctx, cancel := context.WithCancel(context.Background())
	r := &consumer{c: c, stop: cancel, done: make(chan error, 1)}
	if s, ok := src.(*Source); ok {
		r.src = s
	}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.shutdown(t) })
	return r
}

func (r *consumer) shutdown(t testing.TB) {
	r.stop()
	select {
	case err := <-r.done:
		r.done <- err
		if err != nil && !errors.Is(err, core.ErrSourceClosed) {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Consumer.Run did not return within 30s")
	}
}

// Two consumers share a group; one is killed mid-stream (connections cut,
// no final commit, no leave: the coordinator evicts it after the session
// timeout); 20% of the publishes are duplicates. Every effect is applied
// exactly once in Postgres and nothing is lost.
func TestGroupMemberKilledMidStreamEffectsOnce(t *testing.T) {
	total := 20000
	if testing.Short() {
		total = 4000
	}
	unique := total * 4 / 5
	e := newPGEffects(t)
	bs := brokers(t)
	const parts = 4
	topic := newTopic(t, bs, parts)
	group := "g-" + randomHex(4)

	// Duplicates are producer resends: same id, key and body, published
	// later in the stream.
	msgs := make([]*driver.Message, 0, total)
	for i := range unique {
		msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("pay-%06d", i), Key: fmt.Sprintf("acct-%03d", i%97), Body: fmt.Appendf(nil, `{"n":%d}`, i)})
	}
	for len(msgs) < total {
		orig := msgs[rand.IntN(unique)]
		at := rand.IntN(len(msgs)+1-unique/2) + unique/2
		msgs = append(msgs, nil)
		copy(msgs[at+1:], msgs[at:])
		msgs[at] = orig
	}
	pub, err := NewPublisher(context.Background(), bs)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := pub.Publish(context.Background(), topic, msgs...); err != nil {
		t.Fatal(err)
	}
	pub.Close()
	t.Logf("published %d messages (%d unique) in %v", total, unique, time.Since(start))

	opts := []core.Option{core.WithBatchSize(50), core.WithConcurrency(2), core.WithWindow(200)}
	var killA cutter
	srcA := openSource(t, bs, topic, group, killA.option())
	srcB := openSource(t, bs, topic, group)
	start = time.Now()
	a := startConsumer(t, srcA, e, nil, opts...)
	b := startConsumer(t, srcB, e, nil, opts...)

	servicetest.WaitFor(t, 60*time.Second, "consumer A to be mid-stream", func() bool {
		return a.c.Stats().Processed >= int64(unique/5)
	})
	killA.kill() // kill -9: no commit, no leave; the broker notices by itself
	a.stop()
	t.Logf("killed A after %d processed (stats %+v)", a.c.Stats().Processed, a.c.Stats())

	servicetest.WaitFor(t, 90*time.Second, "every message committed by the group", func() bool {
		return drained(t, bs, group, topic, parts)
	})
	elapsed := time.Since(start)
	b.shutdown(t)
	a.shutdown(t)
	as, bst := a.c.Stats(), b.c.Stats()
	t.Logf("consumed %d deliveries in %v; A %+v, B %+v; sources A %+v, B %+v", total, elapsed, as, bst, srcA.Stats(), srcB.Stats())

	rows, ids := e.counts(t)
	if ids != unique {
		t.Errorf("%d distinct ids applied, want %d: messages lost", ids, unique)
	}
	if rows != ids {
		t.Errorf("%d effects for %d ids: applied twice: %v", rows, ids, e.twice(t, e.store.Pool()))
	}
	if p := as.Processed + bst.Processed; p != int64(unique) {
		t.Errorf("Processed %d in all, want %d", p, unique)
	}
	if d := as.Duplicates + bst.Duplicates; d < int64(total-unique) {
		t.Errorf("Duplicates %d in all, want at least the %d duplicate publishes", d, total-unique)
	}
	if bst.Processed == 0 || as.Processed == 0 {
		t.Errorf("both consumers should have processed some: A %d, B %d", as.Processed, bst.Processed)
	}
}

// revoking reports whether s is giving up any partition.
func revoking(s *Source) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.parts {
		if p.revoking {
			return true
		}
	}
	return false
}

// A second member joins while the first is in the middle of a batch
// transaction (its handler is held until the revocation has begun): the
// first stops taking messages of the revoked generation, finishes and
// settles the batch within the revoke timeout, commits and releases. No
// message is redelivered, and every effect is applied once.
func TestRebalanceMidBatch(t *testing.T) {
	e := newPGEffects(t)
	bs := brokers(t)
	const parts = 4
	topic := newTopic(t, bs, parts)
	group := "g-" + randomHex(4)
	const n = 1500
	publishN(t, bs, topic, "rmb", n, func(i int) string { return "k" + strconv.Itoa(i%31) })

	srcA := openSource(t, bs, topic, group)
	inside := make(chan struct{})
	var once sync.Once
	var sawRevoke atomic.Bool
	slow := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		time.Sleep(200 * time.Microsecond)
		if err := e.apply(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "rmb-0300" {
			// Hold this batch's transaction open until the rebalance
			// has begun revoking A's partitions.
			once.Do(func() { close(inside) })
			deadline := time.Now().Add(10 * time.Second)
			for !revoking(srcA) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			sawRevoke.Store(revoking(srcA))
		}
		return nil
	}
	opts := []core.Option{core.WithBatchSize(25), core.WithLinger(5 * time.Millisecond), core.WithWindow(100)}
	a := startConsumer(t, srcA, e, slow, opts...)
	select {
	case <-inside:
	case <-time.After(30 * time.Second):
		t.Fatal("A never reached message rmb-0300")
	}
	srcB := openSource(t, bs, topic, group)
	b := startConsumer(t, srcB, e, slow, opts...)
	servicetest.WaitFor(t, 60*time.Second, "every message committed by the group", func() bool {
		return drained(t, bs, group, topic, parts)
	})
	b.shutdown(t)
	a.shutdown(t)
	as, bst := a.c.Stats(), b.c.Stats()
	t.Logf("A %+v source %+v; B %+v source %+v", as, srcA.Stats(), bst, srcB.Stats())
	if !sawRevoke.Load() {
		t.Fatal("the rebalance did not begin while A's batch was open")
	}
	if srcA.Stats().Revoked == 0 {
		t.Errorf("A gave up no partition: no rebalance happened")
	}
	if bst.Processed == 0 {
		t.Errorf("B processed nothing after joining")
	}
	// The open batch finished within the revoke timeout and was committed
	// before the partitions were released: nothing went stale, nothing
	// was redelivered.
	if as.Stale != 0 || srcA.Stats().StaleSettlements != 0 || as.Duplicates+bst.Duplicates != 0 {
		t.Errorf("stale %d/%d, duplicates %d: the revocation did not let the open batch finish", as.Stale, srcA.Stats().StaleSettlements, as.Duplicates+bst.Duplicates)
	}
	rows, ids := e.counts(t)
	if ids != n || rows != n {
		t.Errorf("%d effects for %d ids, want %d each", rows, ids, n)
	}
	if p := as.Processed + bst.Processed; p != n {
		t.Errorf("Processed %d in all, want %d", p, n)
	}
}

// The revoke timeout passes while A's batch transaction is still open: the
// partition goes to B, which gets the messages while A still holds their
// claims. B's claims wait on the unique key until A commits, then decide
// Duplicate; A's late acks are stale. Effects once.
func TestRevokeTimeoutPassesWithTransactionOpen(t *testing.T) {
	e := newPGEffects(t)
	bs := brokers(t)
	topic := newTopic(t, bs, 2)
	group := "g-" + randomHex(4)
	const n = 5
	// All messages on partition 1, and a balancer that gives every
	// partition to B once it is there (member ids start with the client
	// id): the rebalance surely moves the messages from A to B.
	var rs []*kgo.Record
	for i := range n {
		rs = append(rs, &kgo.Record{Topic: topic, Partition: 1, Value: []byte("v"),
			Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte(fmt.Sprintf("late-%d", i))}}})
	}
	if err := client(t, bs, kgo.RecordPartitioner(kgo.ManualPartitioner())).ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	release := make(chan struct{})
	var releaseOnce sync.Once
	var aCalls, bCalls atomic.Int64
	srcA := openSource(t, bs, topic, group, WithRevokeTimeout(100*time.Millisecond), WithBalancers(preferB{kgo.CooperativeStickyBalancer()}),
		WithClientOptions(kgo.ClientID("a-idemq-test")))
	a := startConsumer(t, srcA, e, func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		aCalls.Add(1)
		if err := e.apply(ctx, tx, m); err != nil {
			return err
		}
		<-release // the whole batch waits here with its claims taken
		return nil
	}, core.WithBatchSize(n), core.WithLinger(200*time.Millisecond), core.WithWindow(2*n))
	// Cleanups run last-in first-out: release A's handler before A's
	// consumer is shut down, even when the test fails.
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	servicetest.WaitFor(t, 20*time.Second, "A's batch to be open", func() bool { return aCalls.Load() == 1 })

	// B joins: the rebalance revokes A's partitions while the batch is
	// open, past A's revoke timeout.
	srcB := openSource(t, bs, topic, group, WithBalancers(preferB{kgo.CooperativeStickyBalancer()}),
		WithClientOptions(kgo.ClientID("b-idemq-test")))
	b := startConsumer(t, srcB, e, func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		bCalls.Add(1)
		return e.apply(ctx, tx, m)
	}, core.WithWindow(2*n))
	servicetest.WaitFor(t, 20*time.Second, "B to receive the messages A still holds", func() bool {
		return b.c.Stats().Received >= 1
	})
	time.Sleep(200 * time.Millisecond) // B's claim is now waiting on A's row locks
	if got := bCalls.Load(); got != 0 {
		t.Fatalf("B's handler ran %d times while A held the claims", got)
	}
	releaseOnce.Do(func() { close(release) })
	servicetest.WaitFor(t, 20*time.Second, "B to decide the redeliveries", func() bool {
		return b.c.Stats().Processed+b.c.Stats().Duplicates >= int64(n)
	})
	servicetest.WaitFor(t, 20*time.Second, "every message committed by the group", func() bool {
		return drained(t, bs, group, topic, 2)
	})
	b.shutdown(t)
	a.shutdown(t)
	as, bst := a.c.Stats(), b.c.Stats()
	t.Logf("A %+v source %+v; B %+v source %+v", as, srcA.Stats(), bst, srcB.Stats())
	if bst.Duplicates != n || bst.Processed != 0 || bCalls.Load() != 0 {
		t.Errorf("B: %d duplicates, %d processed, handler ran %d times; want %d duplicates and no handler run", bst.Duplicates, bst.Processed, bCalls.Load(), n)
	}
	// The batch's acks go in one Ack call: each is refused as stale.
	if as.Processed != n || as.Stale < 1 || srcA.Stats().StaleSettlements != n {
		t.Errorf("A: processed %d, stale %d (source %d); want %d processed, %d stale in the source", as.Processed, as.Stale, srcA.Stats().StaleSettlements, n, n)
	}
	if rows, ids := e.counts(t); rows != n || ids != n {
		t.Errorf("%d effects for %d ids, want %d", rows, ids, n)
	}
}

// holdAcks wraps a Source so that the Acks of first deliveries wait until
// release is closed: their effects are committed in Postgres, their
// offsets not yet marked.
type holdAcks struct {
	*Source
	release chan struct{}
	held    atomic.Int64
	stale   atomic.Int64
}

func (h *holdAcks) Ack(ctx context.Context, ms []*driver.Message) error {
	first := 0
	for _, m := range ms {
		if m.Attempt == 1 {
			first++
		}
	}
	if first > 0 {
		h.held.Add(int64(first))
		<-h.release
	}
	err := h.Source.Ack(ctx, ms)
	var p *driver.Partial
	switch {
	case errors.As(err, &p):
		for _, e := range p.Errs {
			if errors.Is(e, core.ErrStaleDelivery) {
				h.stale.Add(1)
			}
		}
	case errors.Is(err, core.ErrStaleDelivery):
		h.stale.Add(int64(len(ms)))
	}
	return err
}

// A message whose effect was committed but whose offset was not when a
// rebalance revoked its partition is redelivered, and the store decides
// Duplicate: the handler does not run again.
func TestCommittedButUnmarkedIsDuplicateAfterRebalance(t *testing.T) {
	e := newPGEffects(t)
	bs := brokers(t)
	const parts = 2
	topic := newTopic(t, bs, parts)
	group := "g-" + randomHex(4)
	const n = 10
	publishN(t, bs, topic, "dup", n, nil)

	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		calls.Add(1)
		return e.apply(ctx, tx, m)
	}
	// B takes every partition once it joins (preferB).
	prefer := WithBalancers(preferB{kgo.CooperativeStickyBalancer()})
	srcA := openSource(t, bs, topic, group, WithRevokeTimeout(200*time.Millisecond), prefer, WithClientOptions(kgo.ClientID("a-idemq-test")))
	hold := &holdAcks{Source: srcA, release: make(chan struct{})}
	a := startConsumer(t, hold, e, h, core.WithWindow(2*n))
	servicetest.WaitFor(t, 20*time.Second, "A to commit every effect and hold the acks", func() bool { return hold.held.Load() == n })

	// B joins: a rebalance revokes A's partitions while its acks are held.
	b := startConsumer(t, openSource(t, bs, topic, group, prefer, WithClientOptions(kgo.ClientID("b-idemq-test"))), e, h, core.WithWindow(2*n))
	servicetest.WaitFor(t, 20*time.Second, "the rebalance", func() bool { return srcA.Stats().Revoked >= parts })
	close(hold.release)
	servicetest.WaitFor(t, 20*time.Second, "every redelivery decided", func() bool {
		return a.c.Stats().Duplicates+b.c.Stats().Duplicates >= n
	})
	servicetest.WaitFor(t, 20*time.Second, "every message committed by the group", func() bool {
		return drained(t, bs, group, topic, parts)
	})
	b.shutdown(t)
	a.shutdown(t)
	as, bst := a.c.Stats(), b.c.Stats()
	t.Logf("A %+v, B %+v, stale acks %d", as, bst, hold.stale.Load())
	if hold.stale.Load() != n {
		t.Errorf("%d held acks were refused as stale, want %d", hold.stale.Load(), n)
	}
	if as.Stale != n || as.SettleErrors != 0 {
		t.Errorf("A's Consumer counted %d stale settlements and %d settle errors, want %d and 0", as.Stale, as.SettleErrors, n)
	}
	if as.Processed+bst.Processed != n || as.Duplicates+bst.Duplicates != n {
		t.Errorf("Processed %d, Duplicates %d; want %d each", as.Processed+bst.Processed, as.Duplicates+bst.Duplicates, n)
	}
	if calls.Load() != n {
		t.Errorf("handler ran %d times, want %d", calls.Load(), n)
	}
	if rows, ids := e.counts(t); rows != n || ids != n {
		t.Errorf("%d effects for %d ids, want %d", rows, ids, n)
	}
}

// Poison messages go to the dead-letter topic with their cause and where
// they came from; the partition's offset moves past them.
func TestPoisonGoesToDeadLetterTopicWithCause(t *testing.T) {
	e := newPGEffects(t)
	bs := brokers(t)
	const parts = 2
	topic := newTopic(t, bs, parts)
	group := "g-" + randomHex(4)
	const n = 30
	msgs := publishN(t, bs, topic, "poison", n, func(i int) string { return "k" + strconv.Itoa(i%5) })
	where := map[string]record{}
	for _, r := range readAll(t, bs, topic) {
		where[r.headers[DefaultIDHeader]] = r
	}
	h := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		if err := e.apply(ctx, tx, m); err != nil {
			return err
		}
		switch {
		case strings.HasSuffix(m.ID, "7"):
			return core.Permanent(fmt.Errorf("invalid amount in %s", m.ID))
		case strings.HasSuffix(m.ID, "3"):
			return errors.New("upstream keeps timing out")
		}
		return nil
	}
	c := startConsumer(t, openSource(t, bs, topic, group), e, h, core.WithMaxAttempts(3), core.WithBatchSize(5), core.WithWindow(20))
	servicetest.WaitFor(t, 30*time.Second, "every message committed by the group", func() bool {
		return drained(t, bs, group, topic, parts)
	})
	c.shutdown(t)
	st := c.c.Stats()
	if st.DeadLettered != 6 || st.Processed != n-6 {
		t.Errorf("stats %+v: want 6 dead-lettered, %d processed", st, n-6)
	}
	dls := readAll(t, bs, topic+".dlq")
	if len(dls) != 6 {
		t.Fatalf("%d dead letters, want 6", len(dls))
	}
	for _, dl := range dls {
		id := dl.headers[DefaultIDHeader]
		orig, ok := where[id]
		if !ok {
			t.Errorf("dead letter %q is not a published message", id)
			continue
		}
		cause := dl.headers[driver.CauseHeader]
		switch {
		case strings.HasSuffix(id, "7") && !strings.Contains(cause, "invalid amount in "+id):
			t.Errorf("%s: cause %q", id, cause)
		case strings.HasSuffix(id, "3") && (!strings.Contains(cause, core.ErrMaxAttempts.Error()) || !strings.Contains(cause, "timing out")):
			t.Errorf("%s: cause %q", id, cause)
		}
		if dl.headers[driver.OriginHeader] != topic+"/"+strconv.Itoa(int(orig.partition))+"/"+strconv.FormatInt(orig.offset, 10) || dl.headers[HeaderGroup] != group {
			t.Errorf("%s: coordinates %v, want %s/%d@%d", id, dl.headers, topic, orig.partition, orig.offset)
		}
		if string(dl.value) != string(orig.value) || dl.key != orig.key {
			t.Errorf("%s: body %q key %q, want %q %q", id, dl.value, dl.key, orig.value, orig.key)
		}
	}
	// Effects of dead-lettered messages rolled back; the rest applied once.
	rows, ids := e.counts(t)
	if rows != n-6 || ids != n-6 {
		t.Errorf("%d effects for %d ids, want %d", rows, ids, n-6)
	}
	_ = msgs
}

// OrderPerKey through the whole pipeline: each key's committed effects
// happen in offset order. The order is read from a sequence in the
// committed rows, since a replayed batch runs handlers whose first run was
// rolled back. The source hands out a key's next messages before the
// earlier are settled (each key decided by one worker), so a failure
// retried in place must send back those of its key decided after it (in
// its batch, under a savepoint or replayed, and in the batches after).
func TestPerKeyOrderThroughThePipeline(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []core.Option
	}{
		{"one worker, replay", []core.Option{core.WithConcurrency(1), core.WithIsolation(core.IsolateReplay)}},
		{"one worker, savepoints", []core.Option{core.WithConcurrency(1), core.WithIsolation(core.IsolateSavepoints)}},
		{"three workers", []core.Option{core.WithConcurrency(3)}},
		{"three workers, savepoints", []core.Option{core.WithConcurrency(3), core.WithIsolation(core.IsolateSavepoints)}},
	} {
		t.Run(tc.name, func(t *testing.T) { testPerKeyOrder(t, tc.opts, false) })
	}
	// A BatchHandler's failure is pinned by deciding each message alone.
	t.Run("batch handler", func(t *testing.T) { testPerKeyOrder(t, []core.Option{core.WithConcurrency(2)}, true) })
}

func testPerKeyOrder(t *testing.T, opts []core.Option, batch bool) {
	e := newPGEffects(t)
	bs := brokers(t)
	const parts = 2
	topic := newTopic(t, bs, parts)
	group := "g-" + randomHex(4)
	const n, keys = 400, 12
	order := "kafka_order_" + randomHex(5)
	pool := e.store.Pool()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+order+` (seq BIGSERIAL, key TEXT NOT NULL, n INT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+order) })
	// Body {"n":i}; key i%keys: within a key, n grows with the offset.
	publishN(t, bs, topic, "order", n, func(i int) string { return "key-" + strconv.Itoa(i%keys) })
	var mu sync.Mutex
	failed := map[int]bool{}
	h := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		var i int
		if _, err := fmt.Sscanf(string(m.Body), `{"n":%d}`, &i); err != nil {
			return core.Permanent(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+order+` (key, n) VALUES ($1, $2)`, m.Key, i); err != nil {
			return err
		}
		mu.Lock()
		// Fails on its first delivery (deciding it alone again, after a
		// BatchHandler failed, is the same delivery): retried in place.
		first := i%17 == 3 && m.Attempt == 1
		if first {
			failed[i] = true
		}
		mu.Unlock()
		if first {
			return errors.New("transient")
		}
		return e.apply(ctx, tx, m)
	}
	opts = append([]core.Option{core.WithBatchSize(8), core.WithWindow(48), core.WithBackoff(core.ConstantBackoff(30 * time.Millisecond))}, opts...)
	var c *consumer
	if batch {
		c = startBatchConsumer(t, openSource(t, bs, topic, group), e, func(ctx context.Context, tx pgx.Tx, ms []*core.Message) error {
			for _, m := range ms {
				if err := h(ctx, tx, m); err != nil {
					return err
				}
			}
			return nil
		}, opts...)
	} else {
		c = startConsumer(t, openSource(t, bs, topic, group), e, h, opts...)
	}
	servicetest.WaitFor(t, 60*time.Second, "every message committed by the group", func() bool {
		return drained(t, bs, group, topic, parts)
	})
	c.shutdown(t)
	st := c.c.Stats()
	t.Logf("stats %+v, %d failures retried", st, len(failed))

	rows, err := pool.Query(context.Background(), `SELECT key, n FROM `+order+` ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	var violations []string
	count := 0
	for rows.Next() {
		var k string
		var i int
		if err := rows.Scan(&k, &i); err != nil {
			t.Fatal(err)
		}
		count++
		if prev, ok := last[k]; ok && prev >= i {
			violations = append(violations, fmt.Sprintf("%s: %d after %d", k, i, prev))
		}
		last[k] = i
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(violations) > 0 {
		t.Errorf("per-key order broken %d times: %v", len(violations), violations[:min(5, len(violations))])
	}
	if count != n {
		t.Errorf("%d committed order rows, want %d", count, n)
	}
	if st.Retried != int64(len(failed)) || len(failed) == 0 {
		t.Errorf("Retried %d, want %d", st.Retried, len(failed))
	}
	// Messages of a retried key were out and went back behind it.
	if st.HeldBack == 0 {
		t.Errorf("HeldBack 0: no message of a retried key was out")
	}
	if rows, ids := e.counts(t); rows != n || ids != n {
		t.Errorf("%d effects for %d ids, want %d", rows, ids, n)
	}
}

// preferB assigns every partition to the member whose id starts with "b-"
// when there is one, else to the first member, cooperatively (a partition
// moves in two rebalances: revoked, then assigned).
type preferB struct{ kgo.GroupBalancer }

func (preferB) ProtocolName() string { return "idemq-test-prefer-b" }

func (p preferB) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	b, err := kgo.NewConsumerBalancer(p, members)
	return b, b.MemberTopics(), err
}

func (preferB) Balance(b *kgo.ConsumerBalancer, topics map[string]int32) kgo.IntoSyncAssignment {
	members := b.Members()
	owner := &members[0]
	for i := range members {
		if strings.HasPrefix(members[i].MemberID, "b-") {
			owner = &members[i]
		}
	}
	plan := b.NewPlan()
	for topic, n := range topics {
		for p := range n {
			plan.AddPartition(owner, topic, p)
		}
	}
	plan.AdjustCooperative(b)
	return plan
}

// A revoke wait longer than the session timeout: the member keeps
// heartbeating while its open batch finishes, so it is not evicted, its
// final commit is accepted, and nothing is redelivered.
func TestRevokeWaitLongerThanSession(t *testing.T) {
	e := newPGEffects(t)
	bs := brokers(t)
	topic := newTopic(t, bs, 2)
	group := "g-" + randomHex(4)
	const n = 40
	publishN(t, bs, topic, "hb", n, nil)
	timeouts := []Option{WithGroupTimeouts(600*time.Millisecond, 50*time.Millisecond, 5*time.Second), WithRevokeTimeout(4 * time.Second)}
	srcA := openSource(t, bs, topic, group, timeouts...)
	var held atomic.Bool
	a := startConsumer(t, srcA, e, func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		if err := e.apply(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "hb-0010" && !held.Swap(true) {
			// Revocation begins while this batch is open, and lasts
			// three session timeouts.
			for !revoking(srcA) {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(1800 * time.Millisecond)
		}
		return nil
	}, core.WithBatchSize(5), core.WithWindow(20))
	servicetest.WaitFor(t, 20*time.Second, "A to hold message hb-0010", held.Load)
	srcB := openSource(t, bs, topic, group, timeouts...)
	b := startConsumer(t, srcB, e, nil, core.WithWindow(20))
	servicetest.WaitFor(t, 30*time.Second, "every message committed by the group", func() bool {
		return drained(t, bs, group, topic, 2)
	})
	b.shutdown(t)
	a.shutdown(t)
	as, bst := a.c.Stats(), b.c.Stats()
	t.Logf("A %+v source %+v; B %+v source %+v", as, srcA.Stats(), bst, srcB.Stats())
	if as.Stale != 0 || as.Duplicates+bst.Duplicates != 0 || srcA.Stats().CommitErrors != 0 {
		t.Errorf("stale %d, duplicates %d, commit errors %d: A lost its membership during the revoke wait", as.Stale, as.Duplicates+bst.Duplicates, srcA.Stats().CommitErrors)
	}
	if rows, ids := e.counts(t); rows != n || ids != n {
		t.Errorf("%d effects for %d ids, want %d", rows, ids, n)
	}
}

// A hold on a retried key ends when the retried message will not come
// back: A retries m with a delay of an hour, so the rest of m's key waits
// behind it; B joins, takes the partition and decides everything; when B
// leaves, A gets the partition back with new messages of the key, which
// it must decide rather than hand back for ever.
func TestKeyHoldEndsWhenTheRetriedMessageMoved(t *testing.T) {
	e := newPGEffects(t)
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	group := "g-" + randomHex(4)
	key := func(int) string { return "k" }
	publishN(t, bs, topic, "moved", 3, key)
	var tries atomic.Int64
	failFirst := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		if m.ID == "moved-0000" {
			tries.Add(1)
			return errors.New("transient")
		}
		return e.apply(ctx, tx, m)
	}
	prefer := WithBalancers(preferB{kgo.CooperativeStickyBalancer()})
	srcA := openSource(t, bs, topic, group, WithRevokeTimeout(200*time.Millisecond), prefer, WithClientOptions(kgo.ClientID("a-idemq-test")))
	a := startConsumer(t, srcA, e, failFirst, core.WithBackoff(core.ConstantBackoff(time.Hour)))
	servicetest.WaitFor(t, 20*time.Second, "A to retry the first message and hold back its key", func() bool {
		st := a.c.Stats()
		return st.Retried == 1 && st.HeldBack >= 2
	})

	b := startConsumer(t, openSource(t, bs, topic, group, prefer, WithClientOptions(kgo.ClientID("b-idemq-test"))), e, nil)
	servicetest.WaitFor(t, 30*time.Second, "B to decide the three messages", func() bool { return b.c.Stats().Processed == 3 })
	b.shutdown(t)

	publishN(t, bs, topic, "moved-again", 3, key)
	servicetest.WaitFor(t, 30*time.Second, "A to decide the key's new messages", func() bool {
		return a.c.Stats().Processed == 3
	})
	servicetest.WaitFor(t, 20*time.Second, "every message committed by the group", func() bool {
		return drained(t, bs, group, topic, 1)
	})
	a.shutdown(t)
	if rows, ids := e.counts(t); rows != 6 || ids != 6 {
		t.Errorf("%d effects for %d ids, want 6", rows, ids)
	}
	if n := tries.Load(); n != 1 {
		t.Errorf("A tried the first message %d times, want 1", n)
	}
}
