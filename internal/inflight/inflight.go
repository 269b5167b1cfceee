// Package inflight is what a Consumer holds of its source's messages
// between receipt and settlement, written once for every adapter: the
// window and the receivers that fill it, each message settled once,
// settlements gathered into one call per kind, leases extended before they
// pass (up to a maximum), stale messages told from live ones (lease
// lapsed, superseded by a newer delivery, given back), retry delays the
// broker cannot wait out itself, and what is given back at the end.
// core.Consumer runs its pipeline on a Flow; brokertest drives adapters
// through one, a message at a time.
package inflight

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/retry"
)

// Reasons of a stale settlement, wrapped by driver.Stale.
var (
	// ErrRedelivered: the broker delivered the message again while it was
	// held; the newer delivery settles it.
	ErrRedelivered = errors.New("the broker redelivered the message; the newer delivery settles it")
	// ErrLeaseLapsed: the broker's lease passed without an extension; the
	// broker redelivers the message, or will.
	ErrLeaseLapsed = errors.New("the broker lease passed without an extension; the broker redelivers the message")
	// ErrClosed: the flow was closed and gave the message back.
	ErrClosed = errors.New("the source was closed and the message given back")
)

// Kind is what a settlement does.
type Kind uint8

// The kinds of settlement.
const (
	// Ack: the message is done (Processed or Duplicate).
	Ack Kind = iota + 1
	// Retry: hand it back for redelivery after Settlement.Delay.
	Retry
	// DeadLetter: park it with Settlement.Cause.
	DeadLetter
	// Release: hand it back undecided, at once (the Consumer stops).
	Release
)

// Held states.
const (
	held uint32 = iota
	settling
	givenBack
)

// Held is one message the flow holds for its consumer, from receipt until
// its settlement returned. A consumer embeds it in its own record of the
// message (Config.Hold), so holding costs no allocation of its own.
type Held struct {
	// M is the message as the source returned it.
	M *driver.Message
	// Owner is the consumer's record of the message, set by Config.Hold.
	Owner any

	state    atomic.Uint32
	received time.Time // the lease is reckoned from it
	deadline time.Time // when the broker redelivers unless extended; zero: never
	stale    error     // why it went stale while held; guarded by Flow.mu
	waiting  bool      // a retry waits out its delay: no longer extended
	told     bool      // the Abandoner was told it went stale
	prev     *Held     // the held list, guarded by Flow.mu
	next     *Held
	done     chan struct{} // a pushed message's: closed once settled
}

// Config is how a consumer runs a Flow.
type Config struct {
	// Window is the most messages held at once. Required.
	Window int
	// Logger receives the flow's warnings (receive errors, failed
	// extensions) and is handed to the source. Required.
	Logger *slog.Logger
	// Hold returns the Held of a received message, embedded in the
	// consumer's own record of it. Nil allocates a Held.
	Hold func(m *driver.Message) *Held
	// Gate is called, when set, before each Receive with room taken in the
	// window; false gives the room back and ends receiving (the consumer
	// pauses for a store outage inside it).
	Gate func(ctx context.Context) bool
	// KeyOrder is passed to the source as driver.Setup.KeyOrder when it is
	// a driver.Releaser.
	KeyOrder bool
}

// Flow is one source as a consumer holds it. It is safe for concurrent
// use.
type Flow struct {
	src    driver.Source
	traits driver.Traits
	ext    driver.Extender
	ab     driver.Abandoner
	cfg    Config
	log    *slog.Logger
	win    window

	mu     sync.Mutex
	list   Held // sentinel of the held list
	byKey  map[any]*Held
	timers map[*time.Timer]*waited // retries waiting out their delay
	closed bool

	timerMu sync.Mutex     // held while a delay's timer is armed
	waits   sync.WaitGroup // delays' timers armed and not yet done

	stopBeat context.CancelFunc
	beating  sync.WaitGroup
}

// Start starts src (driver.Source.Start) for a consumer configured by cfg
// and returns the flow that holds its messages.
func Start(ctx context.Context, src driver.Source, cfg Config) (*Flow, error) {
	if cfg.Window < 1 {
		return nil, errors.New("inflight: Window must be at least 1")
	}
	// Messages held back behind a key's retry go back by Release.
	_, releaser := src.(driver.Releaser)
	cfg.KeyOrder = cfg.KeyOrder && releaser
	tr, err := src.Start(ctx, driver.Setup{Window: cfg.Window, Logger: cfg.Logger, KeyOrder: cfg.KeyOrder})
	if err != nil {
		return nil, err
	}
	tr.Receivers = max(tr.Receivers, 1)
	if tr.KeyOrder && (!cfg.KeyOrder || tr.Receivers > 1 || !tr.DelaysRetry) {
		return nil, errors.New("inflight: a source reporting Traits.KeyOrder must have been asked for it (Setup.KeyOrder), keep one receiver and wait out retry delays")
	}
	if tr.MaxBatch <= 0 {
		tr.MaxBatch = cfg.Window
	}
	if cfg.Hold == nil {
		cfg.Hold = func(m *driver.Message) *Held { return &Held{M: m} }
	}
	f := &Flow{src: src, traits: tr, cfg: cfg, log: cfg.Logger, stopBeat: func() {}}
	f.ext, _ = src.(driver.Extender)
	f.ab, _ = src.(driver.Abandoner)
	f.win.init(cfg.Window)
	f.list.prev, f.list.next = &f.list, &f.list
	if tr.Lease > 0 {
		var bctx context.Context
		bctx, f.stopBeat = context.WithCancel(context.WithoutCancel(ctx))
		every := max(tr.Lease/3, 10*time.Millisecond)
		f.beating.Go(func() { retry.Every(bctx, every, func(time.Time) { f.beat(bctx, 2*every) }) })
	}
	return f, nil
}

// Traits returns what the source reported at Start.
func (f *Flow) Traits() driver.Traits { return f.traits }

// Source returns the source the flow holds messages of.
func (f *Flow) Source() driver.Source { return f.src }

// Fetch takes room for up to max messages in the window (waiting for at
// least one), calls Gate, receives once from the source and holds what it
// returned. It returns ctx's error, driver.ErrSourceClosed once closed,
// errGated when Gate said no, or the source's error.
func (f *Flow) Fetch(ctx context.Context, max int) ([]*Held, error) {
	return f.fetch(ctx, max, nil)
}

// fetch is Fetch appending to buf[:0].
func (f *Flow) fetch(ctx context.Context, max int, buf []*Held) ([]*Held, error) {
	pull, ok := f.src.(driver.Puller)
	if !ok {
		return nil, errors.New("inflight: the source is not a Puller")
	}
	want := min(max, f.traits.MaxBatch)
	n, err := f.win.take(ctx, want)
	if err != nil {
		return nil, err
	}
	if n < want && f.traits.ReceiveLinger > 0 {
		n += f.win.takeMore(ctx, want-n, f.traits.ReceiveLinger)
	}
	if f.isClosed() {
		f.win.give(n)
		return nil, driver.ErrSourceClosed
	}
	if f.cfg.Gate != nil && !f.cfg.Gate(ctx) {
		f.win.give(n)
		return nil, errGated
	}
	ms, err := pull.Receive(ctx, n)
	if len(ms) > n {
		f.log.Error("idemq: the source returned more messages than asked; the surplus is given back", "asked", n, "got", len(ms))
		_ = f.src.Retry(context.WithoutCancel(ctx), ms[n:], 0)
		ms = ms[:n]
	}
	f.win.give(n - len(ms))
	if len(ms) == 0 {
		if err == nil {
			err = errors.New("inflight: the source's Receive returned no message and no error")
		}
		return nil, err
	}
	hs := buf[:0]
	for _, m := range ms {
		hs = append(hs, f.cfg.Hold(m))
	}
	f.track(hs, time.Now())
	return hs, nil
}

var errGated = errors.New("inflight: receiving paused")

// Pull keeps Traits.Receivers receives outstanding and hands what they
// return to admit (which must not keep the slice it is given), until ctx is done (nil) or the source is closed (an
// error wrapping driver.ErrSourceClosed). Other receive errors are logged
// and tried again after a backoff.
func (f *Flow) Pull(ctx context.Context, admit func([]*Held)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, f.traits.Receivers)
	for range f.traits.Receivers {
		go func() { errc <- f.pullLoop(ctx, admit) }()
	}
	var first error
	for range f.traits.Receivers {
		if err := <-errc; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

func (f *Flow) pullLoop(ctx context.Context, admit func([]*Held)) error {
	pace := retry.New(50*time.Millisecond, 5*time.Second)
	var buf []*Held // admit does not keep it
	for ctx.Err() == nil {
		hs, err := f.fetch(ctx, f.cfg.Window, buf)
		switch {
		case err == nil:
			pace.Reset()
			admit(hs)
			clear(hs)
			buf = hs[:0]
		case ctx.Err() != nil, errors.Is(err, errGated):
			return nil
		case errors.Is(err, driver.ErrSourceClosed):
			return err
		default:
			delay := pace.Next()
			f.log.Warn("idemq: receive failed; trying again", "err", err, "in", delay)
			if !retry.Sleep(ctx, delay) {
				return nil
			}
		}
	}
	return nil
}

// Serve runs a Pusher's Serve until ctx is done: each message it delivers
// takes room in the window, is held and handed to admit, and its deliver
// call returns once the message is settled; it returns the request's
// error only while the message waits for room, never taken.
func (f *Flow) Serve(ctx context.Context, admit func([]*Held)) error {
	push, ok := f.src.(driver.Pusher)
	if !ok {
		return errors.New("inflight: the source is not a Pusher")
	}
	return push.Serve(ctx, func(rctx context.Context, m *driver.Message) error {
		if _, err := f.win.take(rctx, 1); err != nil {
			return err
		}
		if f.isClosed() {
			f.win.give(1)
			return driver.ErrSourceClosed
		}
		h := f.cfg.Hold(m)
		h.done = make(chan struct{})
		f.track([]*Held{h}, time.Now())
		admit([]*Held{h})
		<-h.done // the Consumer settles, or releases, all it took
		return nil
	})
}

// track records hs as held; their leases are reckoned from their
// ReceivedAt, or from now when the adapter left it unset.
func (f *Flow) track(hs []*Held, now time.Time) {
	lease := f.traits.Lease
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, h := range hs {
		h.received = now
		if at := h.M.ReceivedAt; !at.IsZero() && at.Before(now) {
			h.received = at
		}
		if lease > 0 {
			h.deadline = h.received.Add(lease)
		}
		h.prev, h.next = f.list.prev, &f.list
		h.prev.next, f.list.prev = h, h
		if k := h.M.BrokerKey; k != nil {
			if f.byKey == nil {
				f.byKey = map[any]*Held{}
			}
			if old := f.byKey[k]; old != nil && old.stale == nil {
				old.stale = ErrRedelivered
			}
			f.byKey[k] = h
		}
	}
}

// untrackLocked takes h off the held list and returns why it is stale, or
// nil.
func (f *Flow) untrackLocked(h *Held, now time.Time) error {
	if h.next != nil {
		h.prev.next, h.next.prev = h.next, h.prev
		h.prev, h.next = nil, nil
	}
	if k := h.M.BrokerKey; k != nil && f.byKey[k] == h {
		delete(f.byKey, k)
	}
	switch {
	case h.stale != nil:
		return h.stale
	case !h.deadline.IsZero() && !now.Before(h.deadline):
		return ErrLeaseLapsed
	}
	return nil
}

func (f *Flow) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// Held returns the number of messages held.
func (f *Flow) Held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for h := f.list.next; h != &f.list; h = h.next {
		n++
	}
	return n
}
