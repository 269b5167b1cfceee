package unsettled

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
)

func TestSettleOnceAndStaleness(t *testing.T) {
	s := New[int, string](time.Hour, 0)
	a := s.Add(1, "a")
	if err := s.Settle(a); err != nil {
		t.Fatalf("first settlement: %v", err)
	}
	if err := s.Settle(a); !errors.Is(err, driver.ErrAlreadySettled) {
		t.Fatalf("second settlement: %v, want ErrAlreadySettled", err)
	}
	old := s.Add(2, "old")
	newer := s.Add(2, "new")
	if err := s.Settle(old); !errors.Is(err, driver.ErrStaleDelivery) || !errors.Is(err, ErrRedelivered) {
		t.Fatalf("superseded: %v, want stale ErrRedelivered", err)
	}
	if err := s.Settle(newer); err != nil {
		t.Fatalf("the newer delivery: %v", err)
	}
	c := s.Add(3, "c")
	if got := s.Close(); len(got) != 1 || got[0] != c {
		t.Fatalf("Close returned %v, want the one unsettled", got)
	}
	if err := s.Settle(c); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want stale ErrClosed", err)
	}
	if s.Add(4, "late") != nil {
		t.Fatal("Add after Close recorded a delivery")
	}
}

func TestLeaseLapsesUnlessExtendedUpToTheMaximum(t *testing.T) {
	s := New[int, string](50*time.Millisecond, 150*time.Millisecond)
	lapsing := s.Add(1, "x")
	kept := s.Add(2, "y")
	if due := s.Due(time.Now(), time.Hour); len(due) != 2 {
		t.Fatalf("due %d, want 2", len(due))
	}
	s.GiveUp(lapsing)
	for range 5 {
		time.Sleep(30 * time.Millisecond)
		due := s.Due(time.Now(), 40*time.Millisecond)
		for _, e := range due {
			if e == lapsing {
				t.Fatal("a delivery given up is still due")
			}
		}
		s.Extended(due, time.Now())
	}
	if err := s.Settle(lapsing); !errors.Is(err, ErrLeaseLapsed) {
		t.Errorf("given up: %v, want stale ErrLeaseLapsed", err)
	}
	if l := s.Lapses(kept); l.After(kept.Received.Add(150 * time.Millisecond)) {
		t.Errorf("extended to %v past the maximum extension", l.Sub(kept.Received))
	}
	time.Sleep(time.Until(s.Lapses(kept)) + 5*time.Millisecond)
	if due := s.Due(time.Now(), time.Hour); len(due) != 0 {
		t.Errorf("a delivery past its maximum extension is still due")
	}
	if err := s.Settle(kept); !errors.Is(err, ErrLeaseLapsed) {
		t.Errorf("past the maximum: %v, want stale ErrLeaseLapsed", err)
	}
}

func TestLoggerGivenWinsOverTheConsumers(t *testing.T) {
	var g Logger
	if g.Log() != slog.Default() {
		t.Fatal("the zero Logger does not log to slog.Default()")
	}
	consumer := slog.New(slog.DiscardHandler)
	g.SetLogger(consumer)
	if g.Log() != consumer {
		t.Fatal("SetLogger was not taken")
	}
	var h Logger
	given := slog.New(slog.DiscardHandler)
	h.Init(given)
	h.SetLogger(consumer)
	if h.Log() != given {
		t.Fatal("SetLogger replaced the logger given at construction")
	}
}

// fakeDelivery is a delivery of some source.
type fakeDelivery struct {
	driver.Delivery
	src int
	e   *Entry[int, string]
}

func TestTakeSortsABatch(t *testing.T) {
	s := New[int, string](time.Hour, 0)
	mine := func(d *fakeDelivery) bool { return d.src == 1 }
	settle := func(d *fakeDelivery) error { return s.Settle(d.e) }
	a := &fakeDelivery{src: 1, e: s.Add(1, "a")}
	b := &fakeDelivery{src: 1, e: s.Add(2, "b")}
	other := &fakeDelivery{src: 2, e: s.Add(3, "c")}
	if err := s.Settle(b.e); err != nil {
		t.Fatal(err)
	}
	foreign := struct{ driver.Delivery }{}
	own, errs := Take("x", []driver.Delivery{a, b, other, foreign}, mine, settle)
	if len(own) != 1 || own[0] != a {
		t.Fatalf("took %v, want a alone", own)
	}
	if len(errs) != 3 || !errors.Is(errs[0], driver.ErrAlreadySettled) || errs[1].Error() != "x: AckBatch: delivery *unsettled.fakeDelivery is not from this source" ||
		errs[2].Error() != "x: AckBatch: delivery struct { driver.Delivery } is not from this source" {
		t.Fatalf("errors %v", errs)
	}
}

func TestMinIsTheLowestUnsettledKey(t *testing.T) {
	s := New[uint64, struct{}](0, 0)
	if _, ok := Min(s); ok {
		t.Fatal("Min of an empty set found a key")
	}
	entries := map[uint64]*Entry[uint64, struct{}]{}
	for _, k := range []uint64{7, 3, 9, 5} {
		entries[k] = s.Add(k, struct{}{})
	}
	if k, ok := Min(s); !ok || k != 3 {
		t.Fatalf("Min = %d, %v; want 3", k, ok)
	}
	if err := s.Settle(entries[3]); err != nil {
		t.Fatal(err)
	}
	s.Drop(entries[5], ErrLeaseLapsed)
	if k, ok := Min(s); !ok || k != 7 {
		t.Fatalf("Min after settling 3 and dropping 5 = %d, %v; want 7", k, ok)
	}
	if n := testing.AllocsPerRun(100, func() { Min(s) }); n != 0 {
		t.Errorf("Min allocates %v times", n)
	}
	s.Close()
	if _, ok := Min(s); ok {
		t.Fatal("Min of a closed set found a key")
	}
}
