package pgoutbox

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

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/outbox"
)

func TestWriteCommitAndRollback(t *testing.T) {
	url := postgresURL(t)
	pool := newPool(t, url, "pgoutbox-test")
	o := newOutbox(t, pool)
	ctx := context.Background()

	otel.SetTextMapPropagator(propagation.TraceContext{})
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(ctx)
	sctx, span := tp.Tracer("test").Start(ctx, "write order")
	defer span.End()

	given := &outbox.Message{ID: "order-1", Destination: "orders", Key: "customer-7", Headers: map[string]string{"type": "created"}, Body: []byte(`{"n":1}`)}
	assigned := &outbox.Message{Destination: "orders", Body: []byte("x")}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Write(sctx, tx, given, assigned); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if u, err := uuid.Parse(assigned.ID); err != nil || u.Version() != 7 {
		t.Fatalf("assigned id %q is not a UUIDv7 (%v)", assigned.ID, err)
	}
	if _, ok := given.Headers["traceparent"]; ok {
		t.Fatal("Write changed the caller's header map")
	}

	// A rolled-back write leaves nothing.
	tx, _ = pool.Begin(ctx)
	if err := o.Write(ctx, tx, &outbox.Message{ID: "ghost", Destination: "orders"}); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)

	rec := &recorder{}
	r, err := o.NewRelay(pool, rec)
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.RunOnce(ctx)
	if err != nil || n != 2 {
		t.Fatalf("RunOnce = %d, %v; want 2 rows", n, err)
	}
	got := rec.snapshot()
	if len(got) != 2 || got[0].ID != "order-1" || got[1].ID != assigned.ID {
		t.Fatalf("published %v", got)
	}
	m := got[0]
	if m.Key != "customer-7" || string(m.Body) != `{"n":1}` || m.Headers["type"] != "created" || rec.dest[0] != "orders" {
		t.Fatalf("published message %+v to %q", m, rec.dest[0])
	}
	want := span.SpanContext().TraceID().String()
	if tp := m.Headers["traceparent"]; !strings.Contains(tp, want) {
		t.Fatalf("traceparent %q does not carry the writer's trace %s", tp, want)
	}
	if n := count(t, pool, "SELECT count(*) FROM "+o.ident+" WHERE sent_at IS NULL"); n != 0 {
		t.Fatalf("%d rows still pending", n)
	}
	if n, err := r.RunOnce(ctx); n != 0 || err != nil {
		t.Fatalf("second RunOnce = %d, %v; want nothing", n, err)
	}
}

func TestWriteValidation(t *testing.T) {
	url := postgresURL(t)
	pool := newPool(t, url, "pgoutbox-test")
	o := newOutbox(t, pool)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, tc := range []struct {
		m    *outbox.Message
		want string
	}{
		{&outbox.Message{}, "Destination"},
		{&outbox.Message{Destination: "d", Key: strings.Repeat("k", 256)}, "Key"},
		{&outbox.Message{Destination: "d", ID: strings.Repeat("i", 256)}, "ID"},
		{nil, "nil message"},
	} {
		if err := o.Write(ctx, tx, tc.m); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Write(%+v) = %v, want an error naming %s", tc.m, err, tc.want)
		}
	}
	if _, err := New(WithTable("bad-name")); err == nil || !strings.Contains(err.Error(), "WithTable") {
		t.Errorf("New(WithTable(bad-name)) = %v", err)
	}
	for _, opt := range []outbox.Option{outbox.WithBatchSize(0), outbox.WithPollInterval(0), outbox.WithRetention(-1),
		outbox.WithWindow(5), outbox.WithLogger(nil), outbox.WithName(""), outbox.WithMaxBackoff(0), outbox.WithPruneInterval(0, 1)} {
		if _, err := o.NewRelay(pool, &recorder{}, opt); err == nil || !strings.Contains(err.Error(), "outbox: With") {
			t.Errorf("bad option accepted or error without its name: %v", err)
		}
	}
}

// writeKeyed writes n messages per key from several concurrent writers.
// Each transaction first writes its outbox row, then takes the next number
// of the key from a counter row (whose lock it holds until commit, so the
// numbers follow commit order) and stores it in the body. Without Write's
// per-key lock a later row could commit before an earlier one.
func writeKeyed(t testing.TB, pool *pgxpool.Pool, o *Outbox, counters, dest string, keys, perKey, writers int) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (k TEXT PRIMARY KEY, n INT NOT NULL)`, counters)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+counters) })
	for k := range keys {
		pool.Exec(ctx, `INSERT INTO `+counters+` VALUES ($1, 0)`, fmt.Sprint("k", k))
	}
	work := make(chan string, keys*perKey)
	for i := range keys * perKey {
		work <- fmt.Sprint("k", i%keys)
	}
	close(work)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for key := range work {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					m := &outbox.Message{Destination: dest, Key: key}
					if err := o.Write(ctx, tx, m); err != nil {
						return err
					}
					var n int
					if err := tx.QueryRow(ctx, `UPDATE `+counters+` SET n = n + 1 WHERE k = $1 RETURNING n`, key).Scan(&n); err != nil {
						return err
					}
					if rand.IntN(4) == 0 {
						time.Sleep(time.Millisecond) // widen the window between seq and commit
					}
					_, err := tx.Exec(ctx, `UPDATE `+o.ident+` SET body = $1 WHERE id = $2`, []byte(strconv.Itoa(n)), m.ID)
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// checkOrder asserts that msgs hold every number 1..perKey of every key,
// first occurrences in increasing order (later copies are republishes).
func checkOrder(t testing.TB, msgs []*driver.Message, keys, perKey int) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	dups := 0
	for _, m := range msgs {
		if seen[m.ID] {
			dups++
			continue
		}
		seen[m.ID] = true
		n, err := strconv.Atoi(string(m.Body))
		if err != nil {
			t.Fatalf("body %q", m.Body)
		}
		if n != last[m.Key]+1 {
			t.Fatalf("key %s: message %d published after %d", m.Key, n, last[m.Key])
		}
		last[m.Key] = n
	}
	if len(seen) != keys*perKey {
		t.Fatalf("%d distinct messages published, want %d", len(seen), keys*perKey)
	}
	t.Logf("%d messages in order per key, %d republished copies", len(seen), dups)
}

// TestPerKeyOrderTwoRelays runs two relays while concurrent writers commit
// numbered messages on a few keys: every key's messages are published in
// commit order, each at least once.
func TestPerKeyOrderTwoRelays(t *testing.T) {
	url := postgresURL(t)
	pool := newPool(t, url, "pgoutbox-test")
	o := newOutbox(t, pool)
	const keys, perKey = 8, 60
	rec := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	relays := make([]*outbox.Relay, 2)
	for i := range relays {
		r, err := o.NewRelay(pool, rec, outbox.WithBatchSize(7), outbox.WithPollInterval(5*time.Millisecond), outbox.WithName(fmt.Sprint("r", i)))
		if err != nil {
			t.Fatal(err)
		}
		relays[i] = r
		wg.Add(1)
		go func() { defer wg.Done(); r.Run(ctx) }()
	}
	writeKeyed(t, pool, o, "counters_"+suffix(), "orders", keys, perKey, 6)
	waitPending(t, o.Store(pool), 0)
	cancel()
	wg.Wait()
	checkOrder(t, rec.snapshot(), keys, perKey)
	for i, r := range relays {
		if r.Stats().Published == 0 {
			t.Errorf("relay %d published nothing: the work was not shared", i)
		}
		t.Logf("relay %d: %+v", i, r.Stats())
	}
}

func waitPending(t testing.TB, s outbox.Store, want int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, _, err := s.Pending(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows pending after 30s, want %d", n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRelayKilledBetweenPublishAndMark terminates the relay's database
// session right after the broker confirmed a batch, before the rows are
// marked: the rows stay pending and are published again, in order.
func TestRelayKilledBetweenPublishAndMark(t *testing.T) {
	url := postgresURL(t)
	app := "pgoutbox-kill-" + suffix()
	pool := newPool(t, url, app)
	admin := newPool(t, url, "pgoutbox-admin")
	o := newOutbox(t, admin)
	ctx := context.Background()
	tx, _ := pool.Begin(ctx)
	for i := range 20 {
		if err := o.Write(ctx, tx, &outbox.Message{Destination: "d", Key: "k", Body: []byte(strconv.Itoa(i + 1))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	kills := 0
	rec := &recorder{}
	rec.next = func(ctx context.Context, dest string, msgs ...*driver.Message) error {
		if kills < 2 {
			kills++
			// The relay "dies": its session ends before it can mark.
			if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
				return err
			}
		}
		return nil
	}
	r, err := o.NewRelay(pool, rec, outbox.WithBatchSize(8))
	if err != nil {
		t.Fatal(err)
	}
	published, failures := 0, 0
	for range 20 {
		n, err := r.RunOnce(ctx)
		published += n
		if err != nil {
			failures++
		}
		if published == 20 {
			break
		}
	}
	if failures != 2 || published != 20 {
		t.Fatalf("published %d with %d failed marks, want 20 with 2", published, failures)
	}
	msgs := rec.snapshot()
	if len(msgs) != 36 { // 8 + 8 republished, then 8 + 8 + 4
		t.Fatalf("%d publishes, want 36 (two batches of 8 published twice)", len(msgs))
	}
	checkOrder(t, msgs, 1, 20)
	if n := count(t, admin, "SELECT count(*) FROM "+o.ident+" WHERE sent_at IS NULL"); n != 0 {
		t.Fatalf("%d rows pending", n)
	}
}

// TestPublishFailureKeepsRows: a broker error leaves the rows pending and
// postpones them (with growing delays), while rows for other destinations
// keep flowing; a later row of a postponed row's key waits behind it.
func TestPublishFailureKeepsRows(t *testing.T) {
	url := postgresURL(t)
	pool := newPool(t, url, "pgoutbox-test")
	o := newOutbox(t, pool)
	ctx := context.Background()
	write := func(msgs ...*outbox.Message) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return o.Write(ctx, tx, msgs...) }); err != nil {
			t.Fatal(err)
		}
	}
	write(&outbox.Message{Destination: "down", Key: "k", Body: []byte("1")}, &outbox.Message{Destination: "up", Body: []byte("a")})
	var down atomic.Bool
	down.Store(true)
	rec := &recorder{next: func(_ context.Context, dest string, _ ...*driver.Message) error {
		if dest == "down" && down.Load() {
			return errors.New("broker unavailable")
		}
		return nil
	}}
	r, _ := o.NewRelay(pool, rec, outbox.WithRetryBackoff(300*time.Millisecond, time.Second))
	n, err := r.RunOnce(ctx)
	if n != 1 || err == nil || !strings.Contains(err.Error(), "broker unavailable") {
		t.Fatalf("RunOnce = %d, %v; want 1 published and the broker error", n, err)
	}
	if c := count(t, pool, "SELECT count(*) FROM "+o.ident+" WHERE sent_at IS NULL AND attempts = 1 AND available_at > now()"); c != 1 {
		t.Fatalf("failed row not pending and postponed (%d)", c)
	}
	// Postponed: other rows flow, the key's next row waits.
	write(&outbox.Message{Destination: "up", Key: "k", Body: []byte("2")}, &outbox.Message{Destination: "up", Body: []byte("b")})
	if n, err := r.RunOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RunOnce while postponed = %d, %v; want only the unkeyed row", n, err)
	}
	if got := rec.snapshot(); len(got) != 2 || string(got[1].Body) != "b" {
		t.Fatalf("published %d messages, last %q; want a then b", len(got), got[len(got)-1].Body)
	}
	time.Sleep(350 * time.Millisecond)
	down.Store(false)
	if n, err := r.RunOnce(ctx); n != 2 || err != nil {
		t.Fatalf("RunOnce after the delay = %d, %v; want the key's two rows", n, err)
	}
	got := rec.snapshot()
	if string(got[2].Body) != "1" || string(got[3].Body) != "2" {
		t.Fatalf("key k published as %q, %q; want 1, 2", got[2].Body, got[3].Body)
	}
	if st := r.Stats(); st.Published != 4 || st.PublishErrors != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestNotifyWakesRelay: with a one-minute poll interval, a committed write
// is published within a second thanks to LISTEN/NOTIFY.
func TestNotifyWakesRelay(t *testing.T) {
	url := postgresURL(t)
	app := "pgoutbox-notify-" + suffix()
	pool := newPool(t, url, app)
	admin := newPool(t, url, "pgoutbox-admin")
	o := newOutbox(t, admin)
	published := make(chan string, 100)
	rec := &recorder{next: func(_ context.Context, _ string, msgs ...*driver.Message) error {
		for _, m := range msgs {
			published <- m.ID
		}
		return nil
	}}
	r, _ := o.NewRelay(pool, rec, outbox.WithPollInterval(time.Minute), outbox.WithLogger(discard()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(300 * time.Millisecond) // let the first (empty) claim and LISTEN happen
	for i := range 4 {
		if i == 2 {
			// The database drops the relay's connections, the listener's
			// too: it reconnects and NOTIFY works again.
			if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
		}
		start := time.Now()
		m := &outbox.Message{Destination: "d"}
		if err := pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
			return o.Write(ctx, tx, m)
		}); err != nil {
			t.Fatal(err)
		}
		timeout := time.After(5 * time.Second)
		// Earlier rows may come again: a connection dropped before their
		// mark committed.
		for got := ""; got != m.ID; {
			select {
			case got = <-published:
			case <-timeout:
				t.Fatalf("write %d not published within 5s: NOTIFY did not wake the relay", i)
			}
		}
		t.Logf("write %d published %v after commit", i, time.Since(start))
	}
}

// TestRetentionAndMetrics: sent rows are kept until pruned, or deleted at
// once with zero retention; the gauges report pending rows and the age of
// the oldest.
func TestRetentionAndMetrics(t *testing.T) {
	url := postgresURL(t)
	pool := newPool(t, url, "pgoutbox-test")
	o := newOutbox(t, pool)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)

	write := func(n int) {
		pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for range n {
				if err := o.Write(ctx, tx, &outbox.Message{Destination: "d"}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	write(5)
	pool.Exec(ctx, `UPDATE `+o.ident+` SET created_at = now() - interval '90 seconds'`)

	r, _ := o.NewRelay(pool, &recorder{}, outbox.WithMeterProvider(mp), outbox.WithName("orders"), outbox.WithPollInterval(time.Hour))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	// Run registers the gauges; wait until it published the rows.
	write(0)
	go func() { done <- r.Run(runCtx) }()
	gauges := func() (int64, float64, bool) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		var n int64
		var age float64
		found := false
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch d := m.Data.(type) {
				case metricdata.Gauge[int64]:
					if m.Name == "idemq.outbox.pending" {
						n, found = d.DataPoints[0].Value, true
					}
				case metricdata.Gauge[float64]:
					if m.Name == "idemq.outbox.oldest_pending_age" {
						age = d.DataPoints[0].Value
					}
				}
			}
		}
		return n, age, found
	}
	waitPending(t, o.Store(pool), 0)
	cancel()
	<-done
	if n, _, found := gauges(); found {
		t.Fatalf("gauges still reported after Run returned (pending=%d)", n)
	}

	// Gauges while rows are pending: registered by a running relay that
	// cannot publish.
	write(3)
	pool.Exec(ctx, `UPDATE `+o.ident+` SET created_at = now() - interval '90 seconds' WHERE sent_at IS NULL`)
	stuck, _ := o.NewRelay(pool, outbox.PublisherFunc(func(context.Context, string, ...*driver.Message) error {
		return errors.New("down")
	}), outbox.WithMeterProvider(mp), outbox.WithPollInterval(time.Hour), outbox.WithLogger(discard()),
		outbox.WithRetryBackoff(time.Millisecond, time.Millisecond))
	runCtx, cancel = context.WithCancel(ctx)
	go func() { done <- stuck.Run(runCtx) }()
	var n int64
	var age float64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var found bool
		if n, age, found = gauges(); found {
			break
		}
	}
	cancel()
	<-done
	if n != 3 || age < 89 || age > 600 {
		t.Fatalf("pending gauge %d, oldest age %.1fs; want 3 and ~90s", n, age)
	}
	if c := count(t, pool, "SELECT count(*) FROM "+o.ident+" WHERE sent_at IS NOT NULL"); c != 5 {
		t.Fatalf("%d sent rows kept, want 5", c)
	}
	pruned, err := r.Prune(ctx, time.Now().Add(time.Minute))
	if err != nil || pruned != 5 {
		t.Fatalf("Prune = %d, %v; want 5", pruned, err)
	}

	// Zero retention deletes on send.
	time.Sleep(10 * time.Millisecond) // the stuck relay's postponement
	del, _ := o.NewRelay(pool, &recorder{}, outbox.WithRetention(0))
	if n, err := del.RunOnce(ctx); n != 3 || err != nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	if c := count(t, pool, "SELECT count(*) FROM "+o.ident); c != 0 {
		t.Fatalf("%d rows left with zero retention", c)
	}
}
