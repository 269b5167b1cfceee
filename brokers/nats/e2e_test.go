package nats_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	_ "github.com/idemq/idemq/brokers/nats"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/sqlite"
)

// TestEndToEnd is the adapter as a user meets it, through URLs only: a
// producer that knows nothing of idemq publishes orders with nats.go and a
// Nats-Msg-Id (one of them twice, past what JetStream deduplicates: a
// copy with the id in idemq-id), a Consumer opened by URL applies each
// once, a poison order is dead-lettered after its attempts, and after the
// fix the operator redrives it, by URL too, and it is applied once.
func TestEndToEnd(t *testing.T) {
	u := servicetest.NATSURL(t)
	suffix := strings.ToUpper(fmt.Sprintf("%x", time.Now().UnixNano()))
	stream, subject := "E2E_"+suffix, "e2e.orders."+suffix
	nc, err := natsgo.Connect(u)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer func() {
		js.DeleteStream(context.Background(), stream)
		js.DeleteStream(context.Background(), stream+"_DLQ")
	}()
	srcURL := u + "/" + stream + "?consumer=billing&subject=" + subject + "&ack_wait=5s"

	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "e2e.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE paid (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	src, err := core.OpenSource(ctx, srcURL)
	if err != nil {
		t.Fatal(err)
	}
	var fixed atomic.Bool
	c, err := core.New(src, store, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if m.ID == "order-13" && !fixed.Load() {
			return errors.New("cannot price order 13")
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO paid (id) VALUES (?)`, m.ID)
		return err
	}, core.WithName("billing"), core.WithMaxAttempts(3), core.WithBackoff(core.ConstantBackoff(20*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() { stop(); <-done }()

	for i := range 20 {
		if _, err := js.Publish(ctx, subject, fmt.Appendf(nil, `{"n":%d}`, i), jetstream.WithMsgID(fmt.Sprintf("order-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	again := natsgo.NewMsg(subject)
	again.Header.Set("idemq-id", "order-4")
	again.Data = []byte(`{"n":4}`)
	if _, err := js.PublishMsg(ctx, again); err != nil {
		t.Fatal(err)
	}
	servicetest.WaitFor(t, 30*time.Second, "19 paid, 1 duplicate, 1 dead-lettered", func() bool {
		st := c.Stats()
		return st.Processed == 19 && st.Duplicates == 1 && st.DeadLettered == 1
	})

	q, err := core.OpenDeadLetters(ctx, srcURL)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var parked []*core.Parked
	q.Scan(ctx, func(p *core.Parked) error { parked = append(parked, p); return nil })
	if len(parked) != 1 || parked[0].ID != "order-13" || parked[0].Attempt != 3 || !strings.Contains(parked[0].Cause, "cannot price order 13") {
		t.Fatalf("parked %+v", parked)
	}
	fixed.Store(true)
	if n, err := q.Redrive(ctx, nil, nil); n != 1 || err != nil {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	servicetest.WaitFor(t, 30*time.Second, "order 13 paid", func() bool { return c.Stats().Processed == 20 })
	rows, err := store.DB().QueryContext(ctx, `SELECT id, count(*) FROM paid GROUP BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id string
		var k int
		rows.Scan(&id, &k)
		if k != 1 {
			t.Errorf("%s paid %d times", id, k)
		}
		n++
	}
	if n != 20 {
		t.Errorf("%d orders paid, want 20", n)
	}
}
