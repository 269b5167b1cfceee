package brokertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

// The dead-letter cases run when Harness.OperatesDeadLetters is set: the
// adapter registers a DeadLetterQueue for its scheme, opened with the
// fixture's SourceURL.

// openDLQ opens the fixture's dead-letter queue, closed when the test ends.
func openDLQ(t *testing.T, f *Fixture) admin.DeadLetterQueue {
	t.Helper()
	q, err := admin.OpenDeadLetters(context.Background(), f.SourceURL)
	if err != nil {
		t.Fatalf("admin.OpenDeadLetters: %v", err)
	}
	t.Cleanup(func() { _ = q.Close() })
	if q.Name() == "" {
		t.Error("DeadLetterQueue.Name() is empty")
	}
	return q
}

// scan returns the parked messages by id (one copy per id is expected).
func scan(t *testing.T, h Harness, q admin.DeadLetterQueue) map[string]*admin.Parked {
	t.Helper()
	out := map[string]*admin.Parked{}
	err := q.Scan(ctxFor(t, h.ReceiveTimeout), func(p *admin.Parked) error {
		if _, dup := out[p.ID]; dup {
			return fmt.Errorf("%q listed twice", p.ID)
		}
		out[p.ID] = p
		return nil
	})
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return out
}

// waitParked scans until exactly the ids in want are parked (parking may
// land a little after DeadLetter returned on some brokers).
func waitParked(t *testing.T, h Harness, q admin.DeadLetterQueue, want ...string) map[string]*admin.Parked {
	t.Helper()
	deadline := time.Now().Add(h.ReceiveTimeout)
	for {
		got := scan(t, h, q)
		if have := slices.Sorted(maps.Keys(got)); slices.Equal(have, slices.Sorted(slices.Values(want))) {
			return got
		} else if time.Now().After(deadline) {
			t.Fatalf("parked %v, want %v", have, slices.Sorted(slices.Values(want)))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// only selects the parked messages with one of ids.
func only(ids ...string) func(*admin.Parked) bool {
	return func(p *admin.Parked) bool { return slices.Contains(ids, p.ID) }
}

// parkAll dead-letters ds, the deliveries of msgs, each with a cause of
// its own, waits until q lists exactly them, and checks what it lists of
// each: cause, body, attempt, ref and places, time, header and key. It
// returns their ids, sorted.
func parkAll(t *testing.T, h Harness, q admin.DeadLetterQueue, msgs []*driver.Message, ds []*Delivery, begin time.Time) []string {
	t.Helper()
	causes := map[string]string{}
	for i, d := range ds {
		id := d.Message().ID
		causes[id] = fmt.Sprintf("brokertest: bad deploy %d", i)
		if err := d.DeadLetter(ctxFor(t, h.ReceiveTimeout), errors.New(causes[id])); err != nil {
			t.Fatalf("DeadLetter %s: %v", id, err)
		}
	}
	all := msgIDs(msgs)
	parked := waitParked(t, h, q, all...)
	for _, m := range msgs {
		p := parked[m.ID]
		if h.RecordsCause && !strings.Contains(p.Cause, causes[m.ID]) || p.Cause == "" {
			t.Errorf("%s: Cause %q, want it to hold %q", m.ID, p.Cause, causes[m.ID])
		}
		if string(p.Body) != string(m.Body) {
			t.Errorf("%s: Body %q, want %q", m.ID, p.Body, m.Body)
		}
		// A broker that parks messages itself may not record the attempt:
		// 0 says unknown.
		if p.Attempt != 1 && (h.RecordsCause || p.Attempt != 0) {
			t.Errorf("%s: Attempt %d, want 1 (parked on its first delivery)", m.ID, p.Attempt)
		}
		if p.Ref == "" || p.Destination == "" || p.Origin == "" {
			t.Errorf("%s: Ref %q, Destination %q, Origin %q: want all set", m.ID, p.Ref, p.Destination, p.Origin)
		}
		if p.ParkedAt.Before(begin.Add(-time.Minute)) || p.ParkedAt.After(time.Now().Add(time.Minute)) {
			t.Errorf("%s: ParkedAt %v, want about now (%v)", m.ID, p.ParkedAt, begin)
		}
		if got, want := p.Headers["idemq-test"], m.Headers["idemq-test"]; got != want {
			t.Errorf("%s: header idemq-test %q, want %q", m.ID, got, want)
		}
		if h.CarriesKey && p.Key != m.Key {
			t.Errorf("%s: Key %q, want %q", m.ID, p.Key, m.Key)
		}
	}
	return all
}

// testDeadLetterQueue: messages parked by DeadLetter are listed with their
// id, cause (the broker's own reason where it parks them itself), attempt, destination, time, headers and body, and stay parked
// while listed; Redrive puts the chosen ones back on the queue without the
// cause and with the attempt count starting again, and removes only them;
// Purge deletes the chosen ones.
func testDeadLetterQueue(t *testing.T, h Harness) {
	f := h.fixture(t)
	q := openDLQ(t, f)
	msgs := messages("dlq", 4)
	if h.CarriesKey {
		// One key each: all four are received before any is settled, and
		// a broker keeping per-key order hands out one message of a key
		// at a time.
		for i, m := range msgs {
			m.Key = fmt.Sprintf("k%d", i)
		}
	}
	begin := time.Now()
	publish(t, h, f, msgs...)
	s := receiver(t, f, 0)
	ds := receive(t, h, s, len(msgs))
	all := parkAll(t, h, q, msgs, ds, begin)
	// Listing leaves them parked, and nothing came back to the queue.
	waitParked(t, h, q, all...)
	expectQuiet(t, h, s)

	back := all[:2]
	var progress []int
	n, err := admin.Redrive(ctxFor(t, h.ReceiveTimeout), q, only(back...), func(done int) { progress = append(progress, done) })
	if err != nil || n != len(back) {
		t.Fatalf("Redrive = %d, %v; want %d, nil", n, err, len(back))
	}
	if !slices.Equal(progress, []int{1, 2}) {
		t.Errorf("Redrive progress %v, want [1 2]", progress)
	}
	again := receiveExactly(t, h, s, "after Redrive", back)
	for _, d := range again {
		m := d.Message()
		want := msgs[slices.Index(all, m.ID)]
		if string(m.Body) != string(want.Body) || m.Headers["idemq-test"] != want.Headers["idemq-test"] {
			t.Errorf("redriven %s: body %q header %q, want %q %q", m.ID, m.Body, m.Headers["idemq-test"], want.Body, want.Headers["idemq-test"])
		}
		if h.CarriesKey && m.Key != want.Key {
			t.Errorf("redriven %s: Key %q, want %q", m.ID, m.Key, want.Key)
		}
		if c, ok := m.Headers[driver.CauseHeader]; ok {
			t.Errorf("redriven %s still carries the cause %q", m.ID, c)
		}
		if m.Attempt != 1 {
			t.Errorf("redriven %s: Attempt %d, want 1", m.ID, m.Attempt)
		}
	}
	ackAll(t, again)
	waitParked(t, h, q, all[2:]...)

	if n, err := q.Purge(ctxFor(t, h.ReceiveTimeout), only(all[2])); err != nil || n != 1 {
		t.Fatalf("Purge %s = %d, %v; want 1, nil", all[2], n, err)
	}
	waitParked(t, h, q, all[3])
	if n, err := q.Purge(ctxFor(t, h.ReceiveTimeout), func(*admin.Parked) bool { return true }); err != nil || n != 1 {
		t.Fatalf("Purge all = %d, %v; want 1, nil", n, err)
	}
	waitParked(t, h, q)
	expectQuiet(t, h, s)
}

// testPipelineRedrive is the incident the dead-letter queue is for: a bad
// deploy dead-letters messages; after the fix the operator redrives some.
// Each redriven message is applied once, including one whose id was
// applied meanwhile through another copy (decided Duplicate); the others
// stay parked until purged and are never applied.
func testPipelineRedrive(t *testing.T, h Harness) {
	f := h.fixture(t)
	q := openDLQ(t, f)
	e := NewEffects(t)
	msgs := messages("incident", 4)
	all := msgIDs(msgs)
	var broken atomic.Bool
	broken.Store(true)
	r := runConsumer(t, source(t, f), e, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if broken.Load() {
			return core.Permanent(errors.New("brokertest: bad deploy rejects " + m.ID))
		}
		return e.Apply(ctx, tx, m)
	})
	publish(t, h, f, msgs...)
	parked := waitParked(t, h, q, all...)
	for id, p := range parked {
		if h.RecordsCause && !strings.Contains(p.Cause, "bad deploy rejects "+id) || p.Cause == "" {
			t.Errorf("%s: Cause %q does not say why", id, p.Cause)
		}
	}
	broken.Store(false) // the fix is deployed
	twin := *msgs[0]
	publish(t, h, f, &twin)
	waitFor(t, h.ReceiveTimeout, "the twin applied", func() bool { return e.Counts(t)[twin.ID] == 1 })

	n, err := admin.Redrive(ctxFor(t, h.ReceiveTimeout), q, only(all[:3]...), nil)
	if err != nil || n != 3 {
		t.Fatalf("Redrive = %d, %v; want 3, nil", n, err)
	}
	waitFor(t, h.ReceiveTimeout, "the redriven messages decided", func() bool {
		st := r.c.Stats()
		return st.Processed == 3 && st.Duplicates == 1
	})
	waitParked(t, h, q, all[3])
	if n, err := q.Purge(ctxFor(t, h.ReceiveTimeout), only(all[3])); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want 1, nil", n, err)
	}
	waitParked(t, h, q)
	r.finish(t)
	counts := e.Counts(t)
	for i, id := range all {
		want := 1
		if i == 3 {
			want = 0
		}
		if counts[id] != want {
			t.Errorf("%s applied %d times, want %d", id, counts[id], want)
		}
	}
}
