package mysqloutbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/internal/outboxtest"
)

// The driver logs every connection the tests kill on purpose.
func init() { mysqldrv.SetLogger(log.New(io.Discard, "", 0)) }

// mysqlURL returns IDEMQ_MYSQL_URL (default the local MariaDB); unreachable
// skips the test, or fails it with IDEMQ_REQUIRE_SERVICES=1.
func mysqlURL(t testing.TB) string {
	t.Helper()
	return servicetest.MySQLURL(t)
}

func openDB(t testing.TB, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", url)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { db.Close() })
	return db
}

func suffix() string {
	b := make([]byte, 5)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func newOutbox(t testing.TB, db *sql.DB) *Outbox {
	t.Helper()
	o, err := New(WithTable("outbox_" + suffix()))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + o.table + ", " + o.locks()) })
	return o
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// recorder remembers published messages in publish order, then calls next.
type recorder struct {
	mu   sync.Mutex
	msgs []*driver.Message
	next func(ctx context.Context, dest string, msgs ...*driver.Message) error
}

// Close implements driver.Publisher.
func (r *recorder) Close() error { return nil }

func (r *recorder) Publish(ctx context.Context, dest string, msgs ...*driver.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next != nil {
		if err := r.next(ctx, dest, msgs...); err != nil {
			return err
		}
	}
	r.msgs = append(r.msgs, msgs...)
	return nil
}

func (r *recorder) snapshot() []*driver.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*driver.Message(nil), r.msgs...)
}

func count(t testing.TB, db *sql.DB, q string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestWriteAndRelay(t *testing.T) {
	db := openDB(t, mysqlURL(t))
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
	if n, _, err := o.Store(db).Pending(ctx); n != 0 || err != nil {
		t.Fatalf("Pending = %d, %v", n, err)
	}
	if _, err := New(WithTable("1bad")); err == nil || !strings.Contains(err.Error(), "WithTable") {
		t.Fatalf("bad table name: %v", err)
	}
	// Retention: sent rows stay until pruned.
	pruned, err := r.Prune(ctx, time.Now().Add(time.Minute))
	if err != nil || pruned != 2 {
		t.Fatalf("Prune = %d, %v; want 2", pruned, err)
	}
}

// writeKeyed: see the pgoutbox test of the same name.
func writeKeyed(t testing.TB, db *sql.DB, o *Outbox, counters, dest string, keys, perKey, writers int) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE ` + counters + ` (k VARCHAR(50) PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + counters) })
	for k := range keys {
		db.Exec(`INSERT INTO `+counters+` VALUES (?, 0)`, fmt.Sprint("k", k))
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
				if err := writeOne(ctx, db, o, counters, dest, key); err != nil {
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

func writeOne(ctx context.Context, db *sql.DB, o *Outbox, counters, dest, key string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	m := &outbox.Message{Destination: dest, Key: key, Headers: map[string]string{"key": key}}
	if err := o.Write(ctx, tx, m); err != nil {
		return err
	}
	if _, err := tx.Exec(`UPDATE `+counters+` SET n = n + 1 WHERE k = ?`, key); err != nil {
		return err
	}
	var n int
	if err := tx.QueryRow(`SELECT n FROM `+counters+` WHERE k = ?`, key).Scan(&n); err != nil {
		return err
	}
	if mrand.IntN(4) == 0 {
		time.Sleep(time.Millisecond)
	}
	// By primary key: a scan would lock rows the relays hold.
	if _, err := tx.Exec(`UPDATE `+o.table+` SET body = ? WHERE seq = LAST_INSERT_ID()`, []byte(strconv.Itoa(n))); err != nil {
		return err
	}
	return tx.Commit()
}

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
		n, _ := strconv.Atoi(string(m.Body))
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

func waitPending(t testing.TB, s outbox.Store) {
	t.Helper()
	outboxtest.WaitDrained(t, s, 30*time.Second)
}

func TestPerKeyOrderTwoRelays(t *testing.T) {
	db := openDB(t, mysqlURL(t))
	o := newOutbox(t, db)
	const keys, perKey = 8, 60
	rec := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	relays := make([]*outbox.Relay, 2)
	for i := range relays {
		r, err := o.NewRelay(db, rec, outbox.WithBatchSize(7), outbox.WithPollInterval(5*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		relays[i] = r
		wg.Add(1)
		go func() { defer wg.Done(); r.Run(ctx) }()
	}
	writeKeyed(t, db, o, "counters_"+suffix(), "orders", keys, perKey, 6)
	waitPending(t, o.Store(db))
	cancel()
	wg.Wait()
	checkOrder(t, rec.snapshot(), keys, perKey)
	for i, r := range relays {
		if r.Stats().Published == 0 {
			t.Errorf("relay %d published nothing", i)
		}
		t.Logf("relay %d: %+v", i, r.Stats())
	}
}

// TestRelayKilledBetweenPublishAndMark kills the relay's connections (it
// logs in as its own user, so KILL USER finds them) right after the broker
// confirmed: the rows are published again, in order.
func TestRelayKilledBetweenPublishAndMark(t *testing.T) {
	url := mysqlURL(t)
	admin := openDB(t, url)
	user := "idemq_relay_" + suffix()
	for _, s := range []string{
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY 'relay'",
		"GRANT ALL ON *.* TO '" + user + "'@'%'",
	} {
		if _, err := admin.Exec(s); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { admin.Exec("DROP USER '" + user + "'@'%'") })
	cfg, err := mysqldrv.ParseDSN(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = user, "relay"
	db := openDB(t, cfg.FormatDSN())
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
			if _, err := admin.Exec("KILL USER '" + user + "'@'%'"); err != nil {
				t.Errorf("killing the relay's connections: %v", err)
			}
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
}

func TestPublishFailureKeepsRows(t *testing.T) {
	db := openDB(t, mysqlURL(t))
	o := newOutbox(t, db)
	ctx := context.Background()
	tx, _ := db.BeginTx(ctx, nil)
	o.Write(ctx, tx, &outbox.Message{Destination: "d", Body: []byte("a")})
	tx.Commit()
	r, _ := o.NewRelay(db, outbox.PublisherFunc(func(context.Context, string, ...*driver.Message) error {
		return errors.New("broker unavailable")
	}), outbox.WithRetention(0), outbox.WithRetryBackoff(200*time.Millisecond, time.Second))
	if n, err := r.RunOnce(ctx); n != 0 || err == nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	if c := count(t, db, "SELECT COUNT(*) FROM "+o.table+" WHERE sent_at IS NULL"); c != 1 {
		t.Fatalf("%d pending, want 1", c)
	}
	if c := count(t, db, "SELECT COUNT(*) FROM "+o.table+" WHERE attempts = 1 AND available_at > CURRENT_TIMESTAMP(6)"); c != 1 {
		t.Fatalf("failed row not postponed (%d)", c)
	}
	r, _ = o.NewRelay(db, &recorder{}, outbox.WithRetention(0))
	if n, err := r.RunOnce(ctx); n != 0 || err != nil {
		t.Fatalf("RunOnce while postponed = %d, %v; want nothing", n, err)
	}
	time.Sleep(250 * time.Millisecond)
	if n, err := r.RunOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	if c := count(t, db, "SELECT COUNT(*) FROM "+o.table); c != 0 {
		t.Fatalf("%d rows left with zero retention", c)
	}
}
