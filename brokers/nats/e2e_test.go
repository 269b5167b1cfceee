package nats

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
)

// TestEndToEnd is the adapter as a user meets it, through URLs only: a
// producer that knows nothing of idemq publishes orders with nats.go and a
// Nats-Msg-Id (one of them twice, past what JetStream deduplicates: a
// copy with the id in idemq-id), a Consumer opened by URL applies each
// once, a poison order is dead-lettered after its attempts, and after the
// fix the operator redrives it, by URL too, and it is applied once.
func TestEndToEnd(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	js, subject := ts.js, ts.subject
	ctx := ctxFor(t, time.Minute)
	srcURL := ts.url + "/" + ts.name + "?consumer=billing&subject=" + subject + "&ack_wait=5s"

	src, err := core.OpenSource(ctx, srcURL)
	if err != nil {
		t.Fatal(err)
	}
	e := brokertest.NewEffects(t)
	var fixed atomic.Bool
	c, _ := run(t, e, src, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if m.ID == "order-13" && !fixed.Load() {
			return errors.New("cannot price order 13")
		}
		return e.Apply(ctx, tx, m)
	}, core.WithName("billing"), core.WithMaxAttempts(3), core.WithBackoff(core.ConstantBackoff(20*time.Millisecond)))

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

	q, err := admin.OpenDeadLetters(ctx, srcURL)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var parked []*admin.Parked
	q.Scan(ctx, func(p *admin.Parked) error { parked = append(parked, p); return nil })
	if len(parked) != 1 || parked[0].ID != "order-13" || parked[0].Attempt != 3 || !strings.Contains(parked[0].Cause, "cannot price order 13") {
		t.Fatalf("parked %+v", parked)
	}
	fixed.Store(true)
	if n, err := admin.Redrive(ctx, q, nil, nil); n != 1 || err != nil {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	servicetest.WaitFor(t, 30*time.Second, "order 13 paid", func() bool { return c.Stats().Processed == 20 })
	counts := e.Counts(t)
	for id, k := range counts {
		if k != 1 {
			t.Errorf("%s paid %d times", id, k)
		}
	}
	if len(counts) != 20 {
		t.Errorf("%d orders paid, want 20", len(counts))
	}
}
