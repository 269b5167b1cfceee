// Package unsettled is the bookkeeping every broker adapter needs for the
// deliveries it handed out and the Consumer has not settled yet, written
// once: the settle-once guard, the staleness rules (superseded by a
// redelivery of the same message, given back by Close, lease lapsed), the
// heartbeat that keeps their broker leases alive up to a maximum, and the
// logger a Consumer hands over. An adapter keeps only its protocol: how to
// receive, ack, retry, park and extend. An adapter written outside this
// module uses it as the adapters of this one do.
package unsettled

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/retry"
)

// Reasons of a stale settlement, wrapped by driver.Stale.
var (
	// ErrRedelivered: the broker delivered the message again; the newer
	// delivery settles it.
	ErrRedelivered = errors.New("the broker redelivered the message; the newer delivery settles it")
	// ErrLeaseLapsed: the broker lease passed without an extension; the
	// broker redelivers the message, or will.
	ErrLeaseLapsed = errors.New("the broker lease passed without an extension; the broker redelivers the message")
	// ErrClosed: the source was closed and gave the delivery back.
	ErrClosed = errors.New("the source was closed and gave the delivery back")
)

// Set is a source's unsettled deliveries by key (a stream sequence, a
// receipt handle, an entry id: what names one delivery of a message to the
// broker). It is safe for concurrent use.
type Set[K comparable, D any] struct {
	lease, maxExtension time.Duration

	mu     sync.Mutex
	live   map[K]*Entry[K, D]
	closed bool
}

// Entry is one unsettled delivery: the adapter's own data D, and the
// bookkeeping the Set keeps for it.
type Entry[K comparable, D any] struct {
	driver.SettleOnce
	// Key names the delivery to the broker.
	Key K
	// D is the adapter's own data for the delivery.
	D D
	// Received is when the adapter received it.
	Received time.Time

	deadline time.Time // when the broker redelivers unless extended; zero: never
	gone     error     // why it left the set unsettled
	given    bool      // no longer extended
}

// New returns a Set whose deliveries the broker leases for lease (0: no
// lease, as a RabbitMQ channel holds its deliveries until it closes), to be
// extended up to maxExtension after their receipt (0: forever).
func New[K comparable, D any](lease, maxExtension time.Duration) *Set[K, D] {
	return &Set[K, D]{lease: lease, maxExtension: maxExtension, live: map[K]*Entry[K, D]{}}
}

// Add records a delivery received now. A delivery of the same key still
// unsettled is superseded: its settlement is stale (ErrRedelivered). After
// Close, Add returns nil: the adapter gives the delivery back.
func (s *Set[K, D]) Add(key K, d D) *Entry[K, D] {
	now := time.Now()
	e := &Entry[K, D]{Key: key, D: d, Received: now}
	if s.lease > 0 {
		e.deadline = now.Add(s.lease)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if old, ok := s.live[key]; ok {
		old.gone = ErrRedelivered
	}
	s.live[key] = e
	return e
}

// Settle claims the right to settle e and takes it out of the set, before
// the adapter sends anything to the broker. It returns
// driver.ErrAlreadySettled for a second settlement, and a driver.Stale
// error when e was superseded, given back by Close or its lease lapsed:
// then nothing may be sent, the broker redelivers the message.
func (s *Set[K, D]) Settle(e *Entry[K, D]) error {
	if err := e.Claim(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live[e.Key] != e {
		return driver.Stale(e.gone)
	}
	delete(s.live, e.Key)
	if !e.deadline.IsZero() && time.Now().After(e.deadline) {
		return driver.Stale(ErrLeaseLapsed)
	}
	return nil
}

// Drop takes e out of the set without settling it (the broker refused an
// extension for good: e's handle no longer names it), so its settlement is
// stale with reason.
func (s *Set[K, D]) Drop(e *Entry[K, D], reason error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live[e.Key] == e {
		delete(s.live, e.Key)
		e.gone = reason
	}
}

// Close gives every unsettled delivery back: their settlements are stale
// (ErrClosed), and later Adds return nil. It returns them, for an adapter
// that tells the broker (a nack, a visibility of zero).
func (s *Set[K, D]) Close() []*Entry[K, D] {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	out := make([]*Entry[K, D], 0, len(s.live))
	for k, e := range s.live {
		e.gone = ErrClosed
		out = append(out, e)
		delete(s.live, k)
	}
	return out
}

// Len returns the number of unsettled deliveries.
func (s *Set[K, D]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live)
}

// Due returns the deliveries to extend at now: unsettled, not given up,
// within maxExtension of their receipt and not yet lapsed, whose deadline
// comes within margin.
func (s *Set[K, D]) Due(now time.Time, margin time.Duration) []*Entry[K, D] {
	s.mu.Lock()
	defer s.mu.Unlock()
	var due []*Entry[K, D]
	for _, e := range s.live {
		switch {
		case e.given, e.deadline.IsZero(), !now.Before(e.deadline), e.deadline.Sub(now) > margin:
		case s.maxExtension > 0 && !now.Before(e.Received.Add(s.maxExtension)):
		default:
			due = append(due, e)
		}
	}
	return due
}

// Extended records that the broker extended es's leases, measured from
// sent (taken before the request, so no deadline is later than the
// broker's), by lease, but never past maxExtension after the receipt.
func (s *Set[K, D]) Extended(es []*Entry[K, D], sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range es {
		until := sent.Add(s.lease)
		if capAt := e.Received.Add(s.maxExtension); s.maxExtension > 0 && capAt.Before(until) {
			until = capAt
		}
		if s.live[e.Key] == e && e.deadline.Before(until) {
			e.deadline = until
		}
	}
}

// GiveUp stops extending e: it lapses, and the broker redelivers it.
func (s *Set[K, D]) GiveUp(e *Entry[K, D]) {
	s.mu.Lock()
	e.given = true
	s.mu.Unlock()
}

// Lapses reports when e's lease lapses (zero: it has none).
func (s *Set[K, D]) Lapses(e *Entry[K, D]) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return e.deadline
}

// Heartbeat calls beat every interval, with the time of the tick, until ctx
// ends.
func Heartbeat(ctx context.Context, every time.Duration, beat func(now time.Time)) {
	retry.Every(ctx, every, beat)
}

// Logger is a source's logger: one given at construction (an adapter
// option, driver.OpenConfig.Logger) wins; otherwise the Consumer's, handed
// over with SetLogger (driver.LoggerSetter); otherwise slog.Default().
// The zero value logs to slog.Default().
type Logger struct {
	given bool
	l     atomic.Pointer[slog.Logger]
}

// Init sets the logger given at construction; nil gives none.
func (g *Logger) Init(l *slog.Logger) {
	if l != nil {
		g.given = true
		g.l.Store(l)
	}
}

// SetLogger implements driver.LoggerSetter: l is used unless Init was
// given one.
func (g *Logger) SetLogger(l *slog.Logger) {
	if !g.given && l != nil {
		g.l.Store(l)
	}
}

// Log returns the logger in use.
func (g *Logger) Log() *slog.Logger {
	if l := g.l.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// All returns the unsettled deliveries, in no order.
func (s *Set[K, D]) All() []*Entry[K, D] {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Entry[K, D], 0, len(s.live))
	for _, e := range s.live {
		out = append(out, e)
	}
	return out
}

// Min returns the lowest key among s's unsettled deliveries, and false
// when there is none. It allocates nothing, for a path as hot as a batch
// acknowledgement (a RabbitMQ multiple ack may only cover the tags below
// the lowest one still unsettled).
func Min[K cmp.Ordered, D any](s *Set[K, D]) (K, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var low K
	found := false
	for k := range s.live {
		if !found || k < low {
			low, found = k, true
		}
	}
	return low, found
}

// Take sorts the deliveries a BatchSettler's AckBatch is given: those of
// the adapter's type D for which mine holds (this source's) and claim
// claims the right to settle (Set.Settle, or an adapter's own guard). It
// returns the deliveries to acknowledge, and the errors of the others: of
// another source, settled before, or stale.
func Take[D driver.Delivery](scheme string, ds []driver.Delivery, mine func(D) bool, claim func(D) error) ([]D, []error) {
	own := make([]D, 0, len(ds))
	var errs []error
	for _, dd := range ds {
		d, ok := dd.(D)
		if !ok || !mine(d) {
			errs = append(errs, fmt.Errorf("%s: AckBatch: delivery %T is not from this source", scheme, dd))
			continue
		}
		if err := claim(d); err != nil {
			errs = append(errs, err)
			continue
		}
		own = append(own, d)
	}
	return own, errs
}
