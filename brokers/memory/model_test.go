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

// The model test drives the broker with random operations (publish,
// subscribe, receive, ack, retry, dead-letter, crash, close, redrive, with
// lost-ack and crash-on-ack faults) and checks every step against a simple
// model of an at-least-once queue: which copy is delivered next, with which
// attempt number, what each settlement returns, and the queue's counts. No
// lease expires (the visibility timeout is long), so the model needs no
// clock.

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
	holder     *mSub
	leaseSeq   int // delivery sequence of the current lease
}

type mSub struct {
	s      *memory.Subscription
	window int
	held   int // unsettled from the consumer's side
	closed error
}

type mDel struct {
	d       driver.Delivery
	e       *mEntry
	sub     *mSub
	settled bool
}

type model struct {
	b      *memory.Broker
	ready  []*mEntry
	dead   []*mEntry
	all    []*mEntry
	subs   []*mSub
	dels   []*mDel
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
	if st.Ready != len(m.ready) || st.InFlight != m.inFlight() || st.DeadLetters != len(m.dead) || st.Delayed != 0 {
		t.Fatalf("stats %+v, model ready %d in flight %d dead %d", st, len(m.ready), m.inFlight(), len(m.dead))
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
		if e.state == mInFlight && e.holder == s {
			held = append(held, e)
		}
	}
	slices.SortFunc(held, func(a, b *mEntry) int { return a.leaseSeq - b.leaseSeq })
	for _, e := range held {
		e.state, e.holder = mReady, nil
	}
	m.ready = append(held, m.ready...)
}

func (m *model) settleErr(d *mDel) error {
	switch {
	case d.sub.closed != nil:
		return d.sub.closed
	case d.settled:
		return driver.ErrAlreadySettled
	}
	return nil
}

func (m *model) finishSettle(d *mDel) {
	d.settled = true
	d.sub.held--
}

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
				w := rapid.IntRange(1, 4).Draw(t, "window")
				s, err := b.Subscribe("q", memory.WithWindow(w))
				if err != nil {
					t.Fatal(err)
				}
				m.subs = append(m.subs, &mSub{s: s, window: w})
			},
			"receive": func(t *rapid.T) {
				var ok []*mSub
				for _, s := range m.subs {
					if s.closed == nil && s.held < s.window {
						ok = append(ok, s)
					}
				}
				if len(ok) == 0 || len(m.ready) == 0 {
					t.Skip("nothing to receive")
				}
				s := rapid.SampledFrom(ok).Draw(t, "sub")
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				d, err := s.s.Receive(rctx)
				cancel()
				if err != nil {
					t.Fatalf("Receive: %v", err)
				}
				want := m.ready[0]
				got := d.Message()
				if driver.MetadataOf(got.Metadata)[memory.MetaPublishSeq] != want.seq || got.Attempt != want.deliveries+1 {
					t.Fatalf("received seq %s attempt %d, model expects seq %s attempt %d",
						driver.MetadataOf(got.Metadata)[memory.MetaPublishSeq], got.Attempt, want.seq, want.deliveries+1)
				}
				m.ready = m.ready[1:]
				want.deliveries++
				want.state, want.holder = mInFlight, s
				want.leaseSeq, _ = strconv.Atoi(driver.MetadataOf(got.Metadata)[memory.MetaDeliverySeq])
				s.held++
				m.dels = append(m.dels, &mDel{d: d, e: want, sub: s})
			},
			"ack": func(t *rapid.T) {
				d := pickDel(t)
				before := b.Stats("q")
				err := d.d.Ack(ctx)
				if want := m.settleErr(d); want != nil {
					if !errors.Is(err, want) {
						t.Fatalf("Ack = %v, want %v", err, want)
					}
					return
				}
				switch {
				case errors.Is(err, memory.ErrCrashed):
					d.sub.closed = memory.ErrCrashed
					m.requeue(d.sub)
				case err != nil:
					t.Fatalf("Ack: %v", err)
				default:
					m.finishSettle(d)
					if b.Stats("q").AcksLost == before.AcksLost {
						d.e.state, d.e.holder = mDone, nil
					} // else: lost, the entry stays in flight with its holder
				}
			},
			"retry": func(t *rapid.T) {
				d := pickDel(t)
				err := d.d.Retry(ctx, 0)
				if want := m.settleErr(d); want != nil {
					if !errors.Is(err, want) {
						t.Fatalf("Retry = %v, want %v", err, want)
					}
					return
				}
				if err != nil {
					t.Fatalf("Retry: %v", err)
				}
				m.finishSettle(d)
				d.e.state, d.e.holder = mReady, nil
				m.ready = append(m.ready, d.e)
			},
			"deadLetter": func(t *rapid.T) {
				d := pickDel(t)
				err := d.d.DeadLetter(ctx, errors.New("poison"))
				if want := m.settleErr(d); want != nil {
					if !errors.Is(err, want) {
						t.Fatalf("DeadLetter = %v, want %v", err, want)
					}
					return
				}
				if err != nil {
					t.Fatalf("DeadLetter: %v", err)
				}
				m.finishSettle(d)
				d.e.state, d.e.holder = mDead, nil
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
