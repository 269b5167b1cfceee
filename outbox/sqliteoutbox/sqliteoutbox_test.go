package sqliteoutbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/outbox"
)

func TestWriteAndRelay(t *testing.T) {
	db := openDB(t, tempPath(t))
	o := newOutbox(t, db)
	ctx := context.Background()
	given := &outbox.Message{ID: "order-1", Destination: "orders", Key: "customer-7", Headers: map[string]string{"type": "created"}, Body: []byte(`{"n":1}`)}
	assigned := &outbox.Message{Destination: "orders"}
	tx, _ := db.BeginTx(ctx, nil)
	if err := o.Write(ctx, tx, given, assigned); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if u, err := uuid.Parse(assigned.ID); err != nil || u.Version() != 7 {
		t.Fatalf("assigned id %q is not a UUIDv7", assigned.ID)
	}
	tx, _ = db.BeginTx(ctx, nil)
	o.Write(ctx, tx, &outbox.Message{ID: "ghost", Destination: "orders", Key: "customer-7"})
	tx.Rollback()
	if n, age, err := o.Store(db).Pending(ctx); n != 2 || age < 0 || age > time.Minute || err != nil {
		t.Fatalf("Pending = %d, %v, %v", n, age, err)
	}

	rec := &recorder{}
	r, err := o.NewRelay(db, rec)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); n != 2 || err != nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	got := rec.snapshot()
	if len(got) != 2 || got[0].ID != "order-1" || got[1].ID != assigned.ID {
		t.Fatalf("published %+v", got)
	}
	if m := got[0]; m.Key != "customer-7" || string(m.Body) != `{"n":1}` || m.Headers["type"] != "created" {
		t.Fatalf("published %+v", m)
	}
	if n, age, err := o.Store(db).Pending(ctx); n != 0 || age != 0 || err != nil {
		t.Fatalf("Pending = %d, %v, %v", n, age, err)
	}
	if _, err := New(WithTable("1bad")); err == nil || !strings.Contains(err.Error(), "WithTable") {
		t.Fatalf("bad table name: %v", err)
	}
	if err := o.Write(ctx, nil, given); err == nil {
		t.Fatal("Write with a nil tx succeeded")
	}
	// Retention: sent rows stay until pruned.
	if pruned, err := r.Prune(ctx, time.Now().Add(-time.Minute)); err != nil || pruned != 0 {
		t.Fatalf("Prune of older rows = %d, %v; want 0", pruned, err)
	}
	pruned, err := r.Prune(ctx, time.Now().Add(time.Minute))
	if err != nil || pruned != 2 {
		t.Fatalf("Prune = %d, %v; want 2", pruned, err)
	}
}

// TestWriteChunks writes more messages in one call than one INSERT takes.
func TestWriteChunks(t *testing.T) {
	db := openDB(t, tempPath(t))
	o, _ := New(WithTable("events"))
	ctx := context.Background()
	if err := o.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(ctx, db); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	msgs := make([]*outbox.Message, 2*writeChunk+5)
	for i := range msgs {
		msgs[i] = &outbox.Message{Destination: "d", Key: "k", Body: []byte(strconv.Itoa(i + 1))}
	}
	tx, _ := db.BeginTx(ctx, nil)
	if err := o.Write(ctx, tx, msgs...); err != nil {
		t.Fatal(err)
	}
	tx.Commit()
	rec := &recorder{}
	r, _ := o.NewRelay(db, rec, outbox.WithBatchSize(50))
	for {
		n, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	checkOrder(t, rec.snapshot(), 1, len(msgs))
}

// TestClaimIsExclusive holds one relay's claim open: a second relay on
// another handle of the file waits for it, then claims past the rows the
// first one marked. The handles begin deferred transactions (no
// _txlock=immediate), so the claim's first write is what takes the lock.
func TestClaimIsExclusive(t *testing.T) {
	path := tempPath(t)
	deferred := func() *sql.DB {
		db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	db1, db2 := deferred(), deferred()
	o := newOutbox(t, db1)
	ctx := context.Background()
	tx, _ := db1.BeginTx(ctx, nil)
	o.Write(ctx, tx, &outbox.Message{ID: "a", Destination: "d"}, &outbox.Message{ID: "b", Destination: "d"})
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	c1, err := o.Store(db1).Claim(ctx, 1, 10, outbox.HoldKey)
	if err != nil || c1 == nil || len(c1.Rows()) != 1 || c1.Rows()[0].ID != "a" {
		t.Fatalf("first Claim = %v, %v", c1, err)
	}
	type result struct {
		c   outbox.Claimed
		err error
	}
	second := make(chan result, 1)
	go func() {
		c, err := o.Store(db2).Claim(ctx, 10, 10, outbox.HoldKey)
		second <- result{c, err}
	}()
	select {
	case r := <-second:
		t.Fatalf("second Claim ran beside the first: %v, %v", r.c, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := c1.Finish(ctx, outbox.Outcome{Sent: []int64{c1.Rows()[0].Seq}}); err != nil {
		t.Fatal(err)
	}
	r := <-second
	if r.err != nil || r.c == nil || len(r.c.Rows()) != 1 || r.c.Rows()[0].ID != "b" {
		t.Fatalf("second Claim = %v, %v", r.c, r.err)
	}
	if err := r.c.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := o.Store(db2).Pending(ctx); n != 1 {
		t.Fatalf("%d pending after Abort, want 1", n)
	}
}

// writeKeyed writes keys*perKey messages from concurrent writers, each in
// a transaction that also counts its key, the count being the body: per
// key, bodies 1, 2, … in commit order, continuing across calls.
func writeKeyed(t testing.TB, db *sql.DB, o *Outbox, dest string, keys, perKey, writers int) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS counters (k TEXT PRIMARY KEY, n INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		db.Exec(`INSERT OR IGNORE INTO counters VALUES (?, 0)`, fmt.Sprint("k", k))
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
				if err := writeOne(ctx, db, o, dest, key); err != nil {
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

func writeOne(ctx context.Context, db *sql.DB, o *Outbox, dest, key string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	m := &outbox.Message{Destination: dest, Key: key, Headers: map[string]string{"key": key}}
	if err := o.Write(ctx, tx, m); err != nil {
		return err
	}
	if _, err := tx.Exec(`UPDATE counters SET n = n + 1 WHERE k = ?`, key); err != nil {
		return err
	}
	var n int
	if err := tx.QueryRow(`SELECT n FROM counters WHERE k = ?`, key).Scan(&n); err != nil {
		return err
	}
	if mrand.IntN(4) == 0 {
		time.Sleep(time.Millisecond)
	}
	if _, err := tx.Exec(`UPDATE `+o.table+` SET body = ? WHERE id = ?`, []byte(strconv.Itoa(n)), m.ID); err != nil {
		return err
	}
	return tx.Commit()
}

// TestPerKeyOrderTwoRelays runs two relays, each on its own handle of the
// file (as two processes would), while writers add rows and the broker
// fails one publish in eight (the failed rows are postponed, holding back
// the rows of their keys behind them). Halfway, the relay that published
// more stops, and the other carries on from where it left off.
//
// Claims hold SQLite's write lock while publishing, so the relays never
// publish at the same time; a relay that keeps finding full batches tends
// to keep the lock (the other waits in SQLite's busy handler, which
// sleeps), so a second relay is mostly a standby.
func TestPerKeyOrderTwoRelays(t *testing.T) {
	path := tempPath(t)
	db := openDB(t, path)
	o := newOutbox(t, db)
	const keys, perKey = 8, 50
	rec := &recorder{}
	var inFlight atomic.Int32
	pub := outbox.PublisherFunc(func(ctx context.Context, dest string, msgs ...*driver.Message) error {
		if inFlight.Add(1) != 1 {
			t.Error("two relays publish at once")
		}
		defer inFlight.Add(-1)
		if mrand.IntN(8) == 0 {
			return errors.New("broker hiccup")
		}
		return rec.Publish(ctx, dest, msgs...)
	})
	var wg sync.WaitGroup
	relays := make([]*outbox.Relay, 2)
	stops := make([]context.CancelFunc, 2)
	for i := range relays {
		r, err := o.NewRelay(openDB(t, path), pub, outbox.WithBatchSize(7), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithRetryBackoff(5*time.Millisecond, 20*time.Millisecond), outbox.WithMaxBackoff(20*time.Millisecond),
			outbox.WithLogger(discard()))
		if err != nil {
			t.Fatal(err)
		}
		relays[i] = r
		ctx, cancel := context.WithCancel(context.Background())
		stops[i] = cancel
		defer cancel()
		wg.Add(1)
		go func() { defer wg.Done(); r.Run(ctx) }()
	}
	writeKeyed(t, db, o, "orders", keys, perKey/2, 4)
	waitPending(t, o.Store(db))
	busier := 0
	if relays[1].Stats().Published > relays[0].Stats().Published {
		busier = 1
	}
	stops[busier]()
	writeKeyed(t, db, o, "orders", keys, perKey/2, 4)
	waitPending(t, o.Store(db))
	for _, stop := range stops {
		stop()
	}
	wg.Wait()
	checkOrder(t, rec.snapshot(), keys, perKey)
	for i, r := range relays {
		if r.Stats().Published == 0 {
			t.Errorf("relay %d published nothing", i)
		}
		t.Logf("relay %d: %+v", i, r.Stats())
	}
}

// TestRelayKilledBetweenPublishAndMark kills the relay's connections
// (closing them, which rolls back their transactions as a crash of the
// process would) right after the broker confirmed: the rows are published
// again, in order.
func TestRelayKilledBetweenPublishAndMark(t *testing.T) {
	path := tempPath(t)
	admin := openDB(t, path)
	db, k := openKillable(t, path)
	o := newOutbox(t, admin)
	ctx := context.Background()
	tx, _ := admin.BeginTx(ctx, nil)
	for i := range 20 {
		o.Write(ctx, tx, &outbox.Message{Destination: "d", Key: "k", Body: []byte(strconv.Itoa(i + 1))})
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	kills := 0
	rec := &recorder{next: func(ctx context.Context, _ string, _ ...*driver.Message) error {
		if kills < 2 {
			kills++
			k.kill()
		}
		return nil
	}}
	r, _ := o.NewRelay(db, rec, outbox.WithBatchSize(8))
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
	if len(msgs) != 36 {
		t.Fatalf("%d publishes, want 36", len(msgs))
	}
	checkOrder(t, msgs, 1, 20)
	// The killed claims released the write lock: writers go on.
	tx, _ = admin.BeginTx(ctx, nil)
	if err := o.Write(ctx, tx, &outbox.Message{Destination: "d"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func TestPublishFailureKeepsRows(t *testing.T) {
	db := openDB(t, tempPath(t))
	o := newOutbox(t, db)
	ctx := context.Background()
	tx, _ := db.BeginTx(ctx, nil)
	o.Write(ctx, tx, &outbox.Message{Destination: "d", Key: "k", Body: []byte("1")}, &outbox.Message{Destination: "d", Key: "k", Body: []byte("2")})
	tx.Commit()
	r, _ := o.NewRelay(db, outbox.PublisherFunc(func(context.Context, string, ...*driver.Message) error {
		return errors.New("broker unavailable")
	}), outbox.WithRetention(0), outbox.WithRetryBackoff(200*time.Millisecond, time.Second))
	if n, err := r.RunOnce(ctx); n != 0 || err == nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	if c := count(t, db, "SELECT COUNT(*) FROM "+o.table+" WHERE sent_at IS NULL"); c != 2 {
		t.Fatalf("%d pending, want 2", c)
	}
	if c := count(t, db, "SELECT COUNT(*) FROM "+o.table+" WHERE attempts = 1 AND available_at > ?", time.Now().UnixMicro()); c != 2 {
		t.Fatalf("failed rows not postponed (%d)", c)
	}
	rec := &recorder{}
	r, _ = o.NewRelay(db, rec, outbox.WithRetention(0))
	if n, err := r.RunOnce(ctx); n != 0 || err != nil {
		t.Fatalf("RunOnce while postponed = %d, %v; want nothing", n, err)
	}
	time.Sleep(250 * time.Millisecond)
	if n, err := r.RunOnce(ctx); n != 2 || err != nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	checkOrder(t, rec.snapshot(), 1, 2)
	if c := count(t, db, "SELECT COUNT(*) FROM "+o.table); c != 0 {
		t.Fatalf("%d rows left with zero retention", c)
	}
}
