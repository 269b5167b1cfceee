package outboxtest

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/outbox"
)

// Broker is a real broker that rejects one message for good, for
// PoisonBroker.
type Broker struct {
	// Publisher is the relay's publisher to the broker.
	Publisher driver.Publisher
	// Dest is a destination that takes the good messages.
	Dest string
	// Poison is the message the broker rejects: too large for Dest, or
	// sent to a destination that does not exist (Destination set). The
	// test sets its ID and Key.
	Poison outbox.Message
	// Rejection is text of the broker's answer that the parked row's
	// cause must contain.
	Rejection string
	// Received returns the ids of every message dest has received so far,
	// copies included, in the order the broker holds them.
	Received func(t *testing.T, dest string) []string
	// Ordered says whether Received keeps the order of a key's messages
	// (a standard SQS queue does not).
	Ordered bool
	// Fix makes the broker take the poison message: it creates the
	// missing destination or raises the size limit.
	Fix func(t *testing.T)
	// Options are relay options of the broker's test, after the test's own.
	Options []outbox.Option
}

// PoisonAttempts is the WithMaxAttempts of PoisonBroker's relays.
const PoisonAttempts = maxAttempts

// PoisonBroker runs the poison tests on a real broker: rows ok1, poison,
// ok2 of key k1 and other of key k2, written to a table newEnv creates,
// relayed to the broker newBroker returns until the broker's rejection
// parks the poison row with the rejection as its cause, at its first
// failure (the publisher marks the rejection permanent), not after
// PoisonAttempts. With HoldKey ok2
// stays pending while other is published, and a redrive after Fix
// publishes the poison row once, then ok2; with SkipParked ok2 is
// published, and a purge deletes the poison row so that it never reaches
// the broker. Each time the broker is read: it holds exactly the rows
// published, once each.
func PoisonBroker(t *testing.T, newEnv func(t *testing.T) Env, newBroker func(t *testing.T) Broker) {
	t.Run("HoldKey", func(t *testing.T) { poisonHold(t, newEnv(t), newBroker(t)) })
	t.Run("SkipParked", func(t *testing.T) { poisonSkip(t, newEnv(t), newBroker(t)) })
}

// poisonSetup writes the rows and returns a relay to b, the poison's
// destination, and the operator.
func poisonSetup(t *testing.T, env Env, b Broker, opts ...outbox.Option) (*outbox.Relay, string, outbox.Operator) {
	t.Helper()
	op, ok := env.Store.(outbox.Operator)
	if !ok {
		t.Fatalf("%T does not implement outbox.Operator", env.Store)
	}
	poison := b.Poison
	poison.ID, poison.Key = "poison", "k1"
	if poison.Destination == "" {
		poison.Destination = b.Dest
	}
	m := func(id, key string) *outbox.Message {
		return &outbox.Message{ID: id, Key: key, Destination: b.Dest, Body: []byte("body of " + id)}
	}
	if err := env.Write(context.Background(), m("ok1", "k1"), &poison, m("ok2", "k1"), m("other", "k2")); err != nil {
		t.Fatal(err)
	}
	opts = append([]outbox.Option{outbox.WithMaxAttempts(PoisonAttempts), outbox.WithRetryBackoff(time.Millisecond, 20*time.Millisecond),
		outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	r, err := outbox.NewRelay(env.Store, b.Publisher, append(opts, b.Options...)...)
	if err != nil {
		t.Fatal(err)
	}
	return r, poison.Destination, op
}

// relayToPark runs r until it parked a row and published want rows, and
// logs how many publishes and how long parking took.
func relayToPark(t *testing.T, r *outbox.Relay, want int64) {
	t.Helper()
	start := time.Now()
	var parkedAfter time.Duration
	relayUntil(t, r, "the poison parked, the good rows published", func() bool {
		st := r.Stats()
		if st.Parked == 1 && parkedAfter == 0 {
			parkedAfter = time.Since(start)
		}
		return st.Parked == 1 && st.Published == want
	})
	t.Logf("the poison row was parked %v after the relay started, after %d failed publish calls", parkedAfter, r.Stats().PublishErrors)
}

// checkPoison checks that the poison row alone is parked after one
// attempt, with the broker's rejection as its cause.
func checkPoison(t *testing.T, op outbox.Operator, b Broker, dest string) outbox.ParkedRow {
	t.Helper()
	p := parkedAlone(t, op, "the poison row")
	if p.ID != "poison" || p.Key != "k1" || p.Destination != dest || p.Attempts != 1 || !strings.Contains(p.Cause, b.Rejection) {
		t.Fatalf("parked row %+v, want the poison row after 1 attempt with a cause containing %q", p, b.Rejection)
	}
	t.Logf("parked with cause: %s", p.Cause)
	return p
}

// checkReceived checks that dest holds exactly want, once each, and,
// when the broker keeps order, ok1 before ok2 (the order of key k1).
func checkReceived(t *testing.T, b Broker, dest string, want ...string) {
	t.Helper()
	got := b.Received(t, dest)
	if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Fatalf("%s received %q, want %q once each", dest, got, want)
	}
	if b.Ordered && slices.Index(got, "ok2") >= 0 && slices.Index(got, "ok2") < slices.Index(got, "ok1") {
		t.Fatalf("%s received %q: ok2 before ok1", dest, got)
	}
}

func poisonHold(t *testing.T, env Env, b Broker) {
	ctx := context.Background()
	r, dest, op := poisonSetup(t, env, b)
	relayToPark(t, r, 2)
	// ok2 stays held however often the relay looks.
	for range 5 {
		if n, err := r.RunOnce(ctx); n != 0 || err != nil {
			t.Fatalf("RunOnce with k1 held = %d, %v", n, err)
		}
	}
	p := checkPoison(t, op, b, dest)
	if st := stats(t, op); st.Pending != 1 || st.Parked != 1 || st.HeldKeys != 1 || st.HeldRows != 1 {
		t.Fatalf("stats %+v, want ok2 pending behind the parked row", st)
	}
	checkReceived(t, b, b.Dest, "ok1", "other")

	b.Fix(t)
	if n, err := op.Redrive(ctx, outbox.ParkedFilter{Seqs: []int64{p.Seq}}); n != 1 || err != nil {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	relayUntil(t, r, "the poison and ok2 published", func() bool { return r.Stats().Published == 4 })
	for range 3 {
		r.RunOnce(ctx)
	}
	if st := stats(t, op); st != (outbox.TableStats{}) {
		t.Fatalf("stats after the redrive %+v, want nothing left", st)
	}
	if dest == b.Dest {
		checkReceived(t, b, dest, "ok1", "other", "poison", "ok2")
		return
	}
	checkReceived(t, b, b.Dest, "ok1", "other", "ok2")
	checkReceived(t, b, dest, "poison")
}

func poisonSkip(t *testing.T, env Env, b Broker) {
	ctx := context.Background()
	r, dest, op := poisonSetup(t, env, b, outbox.WithParkedKey(outbox.SkipParked))
	relayToPark(t, r, 3)
	p := checkPoison(t, op, b, dest)
	if st := stats(t, op); st.Pending != 0 || st.Parked != 1 || st.HeldKeys != 0 {
		t.Fatalf("stats %+v, want the poison parked, nothing held", st)
	}
	checkReceived(t, b, b.Dest, "ok1", "ok2", "other")

	if n, err := op.Purge(ctx, outbox.ParkedFilter{Seqs: []int64{p.Seq}}); n != 1 || err != nil {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	b.Fix(t)
	for range 3 {
		r.RunOnce(ctx)
	}
	if st := stats(t, op); st != (outbox.TableStats{}) || r.Stats().Published != 3 {
		t.Fatalf("stats after the purge %+v (relay %+v), want nothing left and nothing more published", st, r.Stats())
	}
	if dest == b.Dest {
		checkReceived(t, b, dest, "ok1", "ok2", "other")
		return
	}
	checkReceived(t, b, b.Dest, "ok1", "ok2", "other")
	checkReceived(t, b, dest)
}
