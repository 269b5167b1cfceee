package nats

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	natsgo "github.com/nats-io/nats.go"
)

// TestSharedDeadLetterStream: two consumers of one stream park in one
// dead-letter stream on subjects of their own; each one's DeadLetters
// lists, redrives and purges only its own, and a redriven message reaches
// every consumer of the subject (the other decides it as it likes: here
// it acks).
func TestSharedDeadLetterStream(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	ctx := ctxFor(t, 30*time.Second)
	shared := WithDeadLetterStream(ts.name + "_DLQ")
	_, a := receiver(t, ts, WithConsumer("a"), shared)
	_, b := receiver(t, ts, WithConsumer("b"), shared)
	if err := ts.publishRaw(ctx, DefaultIDHeader, &driver.Message{ID: "m1", Body: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*brokertest.Receiver{a, b} {
		d := receiveOne(t, r, 5*time.Second)
		if err := d.DeadLetter(ctx, core.Permanent(context.DeadlineExceeded)); err != nil {
			t.Fatal(err)
		}
	}
	qa, err := OpenDeadLetters(ctx, ts.addr(), ts.opts(t, WithConsumer("a"), shared)...)
	if err != nil {
		t.Fatal(err)
	}
	defer qa.Close()
	qb, err := OpenDeadLetters(ctx, ts.addr(), ts.opts(t, WithConsumer("b"), shared)...)
	if err != nil {
		t.Fatal(err)
	}
	defer qb.Close()
	count := func(q *DeadLetters) (n int, origin string) {
		t.Helper()
		if err := q.Scan(ctx, func(p *admin.Parked) error { n++; origin = p.Origin; return nil }); err != nil {
			t.Fatal(err)
		}
		return n, origin
	}
	if n, o := count(qa); n != 1 || o != ts.name+"/a/1" {
		t.Fatalf("a: %d parked from %q", n, o)
	}
	if n, o := count(qb); n != 1 || o != ts.name+"/b/1" {
		t.Fatalf("b: %d parked from %q", n, o)
	}
	if n, err := qa.Redrive(ctx, nil, nil); n != 1 || err != nil {
		t.Fatalf("Redrive a = %d, %v", n, err)
	}
	for _, r := range []*brokertest.Receiver{a, b} {
		d := receiveOne(t, r, 5*time.Second)
		if d.Message().ID != "m1" || d.Message().Attempt != 1 {
			t.Fatalf("redriven %q attempt %d", d.Message().ID, d.Message().Attempt)
		}
		d.Ack(ctx)
	}
	if n, _ := count(qa); n != 0 {
		t.Fatalf("a: %d parked after Redrive", n)
	}
	if n, err := qb.Purge(ctx, nil); n != 1 || err != nil {
		t.Fatalf("Purge b = %d, %v", n, err)
	}
	if n, _ := count(qb); n != 0 {
		t.Fatalf("b: %d parked after Purge", n)
	}
	// Without declare, everything exists now: a source opens.
	_, c := receiver(t, ts, WithConsumer("a"), shared, WithDeclare(false))
	expectNothing(t, c, 300*time.Millisecond)
}

// TestLegacySubjectHeader: a copy parked with idemq-subject, the header an
// earlier version wrote instead of idemq-destination, is redriven there,
// without it.
func TestLegacySubjectHeader(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	ctx := ctxFor(t, 30*time.Second)
	_, s := receiver(t, ts)
	m := natsgo.NewMsg("idemq.dlq." + ts.name + ".worker")
	m.Header.Set(IDHeader, "old-1")
	m.Header.Set(legacySubjectHeader, ts.subject)
	m.Header.Set(driver.CauseHeader, "bad deploy")
	if _, err := ts.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	q, err := OpenDeadLetters(ctx, ts.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if n, err := q.Redrive(ctx, nil, nil); n != 1 || err != nil {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	d := receiveOne(t, s, 5*time.Second)
	if got := d.Message(); got.ID != "old-1" || got.Headers[legacySubjectHeader] != "" || got.Headers[driver.CauseHeader] != "" {
		t.Fatalf("redriven %+v", got)
	}
}
