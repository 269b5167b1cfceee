package memory_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"pgregory.net/rapid"

	"github.com/idemq/idemq/brokers/memory"
)

// The model test drives the broker through a Subscription's driver
// methods with random operations (publish, subscribe, receive a batch,
// ack, retry, dead-letter, release, crash, close, redrive, with lost-ack
// and crash-on-ack faults) and checks every step against a simple model of
// an at-least-once queue: which copies a Receive hands out, in which
// order and with which attempt numbers, what each settlement returns, and
// the queue's counts. No lease expires (the visibility timeout is long),
// so the model needs no clock.

type mState int

const (
	mReady mState = iota
	mInFlight
	mDone
	mDead
)

type mEntry struct {
	seq        string // MetaPublishSeq
	deliveries int
	state      mState
	lease      *mDel // the current lease while in flight
}

type mSub struct {
	s      *memory.Subscription
	closed error
}

type mDel struct {
	m   *driver.Message
	e   *mEntry
	sub *mSub
	seq int // MetaDeliverySeq
}

type model struct {
	b      *memory.Broker
	ready  []*mEntry
	dead   []*mEntry
	all    []*mEntry
	subs   []*mSub
	dels   []*mDel
	stale  int64 // settlements the broker should refuse as stale
	nextID int
}

func (m *model) inFlight() int {
	n := 0
	for _, e := range m.all {
		if e.state == mInFlight {
			n++
		}
	}
	return n
}

func (m *model) check(t *rapid.T) {
	st := m.b.Stats("q")
	if st.Ready != len(m.ready) || st.InFlight != m.inFlight() || st.DeadLetters != len(m.dead) || st.Delayed != 0 || st.StaleSettlements != m.stale {
		t.Fatalf("stats %+v, model ready %d in flight %d dead %d stale settlements %d", st, len(m.ready), m.inFlight(), len(m.dead), m.stale)
	}
	if n := m.b.Len("q"); n != len(m.ready)+m.inFlight() {
		t.Fatalf("Len %d, model %d", n, len(m.ready)+m.inFlight())
	}
}

// requeue returns what sub holds to the front of the queue in delivery
// order, as a crash or close does.
func (m *model) requeue(s *mSub) {
	var held []*mEntry
	for _, e := range m.all {
		if e.state == mInFlight && e.lease.sub == s {
			held = append(held, e)
		}
	}
	slices.SortFunc(held, func(a, b *mEntry) int { return a.lease.seq - b.lease.seq })
	for _, e := range held {
		e.state, e.lease = mReady, nil
	}
	m.ready = append(held, m.ready...)
}

// settleErr is the error the broker must return for a settlement of d,
// or nil when d is the current lease of its message; a refused stale one
// is counted.
func (m *model) settleErr(d *mDel) error {
	switch {
	case d.sub.closed != nil:
		return d.sub.closed
	case d.e.state != mInFlight || d.e.lease != d:
		m.stale++
		return memory.ErrLeaseExpired
	}
	return nil
}

// settled ends d's lease and moves its message to state.
func settled(d *mDel, state mState) { d.e.state, d.e.lease = state, nil }

func TestModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := rapid.Uint64().Draw(t, "seed")
		b, err := memory.NewBroker(memory.WithSeed(seed), memory.WithVisibilityTimeout(time.Hour),
			memory.WithFaults(memory.Faults{LoseAck: 0.2, CrashOnAck: 0.05}))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		m := &model{b: b}
		ctx := context.Background()

		pickDel := func(t *rapid.T) *mDel {
			if len(m.dels) == 0 {
				t.Skip("no deliveries")
			}
			return rapid.SampledFrom(m.dels).Draw(t, "delivery")
		}
		// refused checks a settlement the broker must refuse, and reports
		// whether it was one.
		refused := func(t *rapid.T, what string, d *mDel, err error) bool {
			want := m.settleErr(d)
			if want == nil {
				return false
			}
			if !errors.Is(err, want) || !errors.Is(err, driver.ErrStaleDelivery) {
				t.Fatalf("%s = %v, want %v (a stale delivery)", what, err, want)
			}
			return true
		}
		t.Repeat(map[string]func(*rapid.T){
			"publish": func(t *rapid.T) {
				n := rapid.IntRange(1, 5).Draw(t, "n")
				msgs := make([]*driver.Message, n)
				for i := range msgs {
					m.nextID++
					msgs[i] = &driver.Message{ID: fmt.Sprint("id", m.nextID)}
					e := &mEntry{seq: strconv.Itoa(len(m.all) + 1)}
					m.all = append(m.all, e)
					m.ready = append(m.ready, e)
				}
				if err := b.Publish(ctx, "q", msgs...); err != nil {
					t.Fatal(err)
				}
			},
			"subscribe": func(t *rapid.T) {
				s, err := b.Subscribe("q")
				if err != nil {
					t.Fatal(err)
				}
				m.subs = append(m.subs, &mSub{s: s})
			},
			"receive": func(t *rapid.T) {
				var ok []*mSub
				for _, s := range m.subs {
					if s.closed == nil {
						ok = append(ok, s)
					}
				}
				if len(ok) == 0 || len(m.ready) == 0 {
					t.Skip("nothing to receive")
				}
				s := rapid.SampledFrom(ok).Draw(t, "sub")
				max := rapid.IntRange(1, 4).Draw(t, "max")
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				got, err := s.s.Receive(rctx, max)
				cancel()
				if err != nil {
					t.Fatalf("Receive: %v", err)
				}
				if want := min(max, len(m.ready)); len(got) != want {
					t.Fatalf("Receive(%d) returned %d messages, model expects %d", max, len(got), want)
				}
				for _, g := range got {
					want := m.ready[0]
					md := driver.MetadataOf(g.Metadata)
					if md[memory.MetaPublishSeq] != want.seq || g.Attempt != want.deliveries+1 {
						t.Fatalf("received seq %s attempt %d, model expects seq %s attempt %d",
							md[memory.MetaPublishSeq], g.Attempt, want.seq, want.deliveries+1)
					}
					m.ready = m.ready[1:]
					d := &mDel{m: g, e: want, sub: s}
					d.seq, _ = strconv.Atoi(md[memory.MetaDeliverySeq])
					want.deliveries++
					want.state, want.lease = mInFlight, d
					m.dels = append(m.dels, d)
				}
			},
			"ack": func(t *rapid.T) {
				d := pickDel(t)
				before := b.Stats("q")
				err := d.sub.s.Ack(ctx, []*driver.Message{d.m})
				if refused(t, "Ack", d, err) {
					return
				}
				switch {
				case errors.Is(err, memory.ErrCrashed):
					d.sub.closed = memory.ErrCrashed
					m.requeue(d.sub)
				case err != nil:
					t.Fatalf("Ack: %v", err)
				case b.Stats("q").AcksLost == before.AcksLost:
					settled(d, mDone)
				} // else: lost, the message stays leased to d
			},
			"retry": func(t *rapid.T) {
				d := pickDel(t)
				err := d.sub.s.Retry(ctx, []*driver.Message{d.m}, 0)
				if refused(t, "Retry", d, err) {
					return
				}
				if err != nil {
					t.Fatalf("Retry: %v", err)
				}
				settled(d, mReady)
				m.ready = append(m.ready, d.e)
			},
			"release": func(t *rapid.T) {
				d := pickDel(t)
				err := d.sub.s.Release(ctx, []*driver.Message{d.m})
				if refused(t, "Release", d, err) {
					return
				}
				if err != nil {
					t.Fatalf("Release: %v", err)
				}
				settled(d, mReady)
				m.ready = append([]*mEntry{d.e}, m.ready...)
			},
			"deadLetter": func(t *rapid.T) {
				d := pickDel(t)
				err := d.sub.s.DeadLetter(ctx, []*driver.Message{d.m}, []error{errors.New("poison")})
				if refused(t, "DeadLetter", d, err) {
					return
				}
				if err != nil {
					t.Fatalf("DeadLetter: %v", err)
				}
				settled(d, mDead)
				m.dead = append(m.dead, d.e)
			},
			"crash": func(t *rapid.T) {
				if len(m.subs) == 0 {
					t.Skip("no subscriptions")
				}
				s := rapid.SampledFrom(m.subs).Draw(t, "sub")
				s.s.Crash()
				if s.closed == nil {
					s.closed = memory.ErrCrashed
					m.requeue(s)
				}
			},
			"close": func(t *rapid.T) {
				if len(m.subs) == 0 {
					t.Skip("no subscriptions")
				}
				s := rapid.SampledFrom(m.subs).Draw(t, "sub")
				if err := s.s.Close(); err != nil {
					t.Fatal(err)
				}
				if s.closed == nil {
					s.closed = memory.ErrSubscriptionClosed
					m.requeue(s)
				}
			},
			"redrive": func(t *rapid.T) {
				if n := b.Redrive("q"); n != len(m.dead) {
					t.Fatalf("Redrive = %d, model has %d dead letters", n, len(m.dead))
				}
				for _, e := range m.dead {
					e.state, e.deliveries = mReady, 0
				}
				m.ready = append(m.ready, m.dead...)
				m.dead = nil
			},
			"": m.check,
		})
	})
}
