package inflight

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// Settlement is one decided message.
type Settlement struct {
	H     *Held
	Kind  Kind
	Delay time.Duration // Retry's
	Cause error         // DeadLetter's
}

// Done is told the result of one settlement: nil, a driver.Stale error
// (nothing was sent: the broker redelivers), driver.ErrAlreadySettled, or
// the source's error. It runs before the message's room in the window is
// freed.
type Done func(s Settlement, err error)

// Settle settles ss: each message once; a stale one is not sent; the acks
// in one Ack call, the retries in one Retry call per delay, the dead
// letters in one DeadLetter call, the give-backs in one Release. A retry
// the broker cannot delay (Traits.DelaysRetry false) stays held, unextended,
// for its delay and is sent then: its done comes later. ctx bounds the
// calls made now.
func (f *Flow) Settle(ctx context.Context, ss []Settlement, done Done) {
	b := batches.Get().(*batch)
	defer b.recycle()
	now := time.Now()
	f.mu.Lock()
	for _, s := range ss {
		h := s.H
		if !h.state.CompareAndSwap(held, settling) {
			b.refused = append(b.refused, result{s, f.settledErr(h)})
			continue
		}
		if s.Kind == Retry && s.Delay > 0 && !f.traits.DelaysRetry && !f.closed {
			h.waiting = true
			b.later = append(b.later, s)
			continue
		}
		if err := f.untrackLocked(h, now); err != nil {
			b.stale(s, err)
			continue
		}
		b.add(s)
	}
	if len(b.later) > 0 {
		f.waitLocked(slices.Clone(b.later), done)
	}
	abandon := f.untoldLocked(b.now)
	f.mu.Unlock()
	if len(abandon) > 0 {
		f.ab.Abandon(ctx, abandon)
	}
	f.send(ctx, b, done)
}

// untoldLocked marks the stale results of rs told and returns their
// messages, for an Abandoner not yet told of them.
func (f *Flow) untoldLocked(rs []result) []*driver.Message {
	if f.ab == nil {
		return nil
	}
	var ms []*driver.Message
	for _, r := range rs {
		if h := r.s.H; !h.told && errors.Is(r.err, driver.ErrStaleDelivery) {
			h.told = true
			ms = append(ms, h.M)
		}
	}
	return ms
}

// batches recycles what Settle sorts its settlements into.
var batches = sync.Pool{New: func() any { return new(batch) }}

// recycle empties b and puts it back in batches.
func (b *batch) recycle() {
	for _, p := range []*[]Settlement{&b.acks, &b.dls, &b.backs, &b.later} {
		clear(*p)
		*p = (*p)[:0]
	}
	for i := range b.retries {
		b.retries[i] = nil
	}
	b.retries = b.retries[:0]
	clear(b.now)
	clear(b.refused)
	b.now, b.refused = b.now[:0], b.refused[:0]
	batches.Put(b)
}

// settledErr is the error of a second settlement of h.
func (f *Flow) settledErr(h *Held) error {
	if h.state.Load() == givenBack {
		return driver.Stale(ErrClosed)
	}
	return driver.ErrAlreadySettled
}

// batch is what one Settle sends, by call.
type batch struct {
	acks, dls, backs []Settlement
	retries          [][]Settlement // one per delay
	now              []result       // decided without a call
	refused          []result       // settled before: not this call's to finish
	later            []Settlement
}

type result struct {
	s   Settlement
	err error
}

func (b *batch) stale(s Settlement, err error) { b.now = append(b.now, result{s, driver.Stale(err)}) }

func (b *batch) add(s Settlement) {
	switch s.Kind {
	case Ack:
		b.acks = append(b.acks, s)
	case DeadLetter:
		b.dls = append(b.dls, s)
	case Release:
		b.backs = append(b.backs, s)
	default:
		for i, g := range b.retries {
			if g[0].Delay == s.Delay {
				b.retries[i] = append(g, s)
				return
			}
		}
		b.retries = append(b.retries, []Settlement{s})
	}
}

// send makes b's calls and reports every result.
func (f *Flow) send(ctx context.Context, b *batch, done Done) {
	for _, r := range b.refused {
		if done != nil {
			done(r.s, r.err)
		}
	}
	for _, r := range b.now {
		f.finish(r.s, r.err, done)
	}
	if len(b.acks) > 0 {
		ms := messages(b.acks)
		f.report(b.acks, f.src.Ack(ctx, *ms), done)
		putMessages(ms)
	}
	for _, g := range b.retries {
		ms := messages(g)
		f.report(g, f.src.Retry(ctx, *ms, g[0].Delay), done)
		putMessages(ms)
	}
	if len(b.backs) > 0 {
		ms := messages(b.backs)
		f.report(b.backs, f.release(ctx, *ms), done)
		putMessages(ms)
	}
	if len(b.dls) > 0 {
		causes := make([]error, len(b.dls))
		for i, s := range b.dls {
			causes[i] = s.Cause
		}
		ms := messages(b.dls)
		f.report(b.dls, f.src.DeadLetter(ctx, *ms, causes), done)
		putMessages(ms)
	}
}

// msgSlices recycles the slices settlement calls are given: a source must
// not keep one past its call.
var msgSlices = sync.Pool{New: func() any { return new([]*driver.Message) }}

// messages returns the messages of ss in a recycled slice; putMessages
// gives it back.
func messages(ss []Settlement) *[]*driver.Message {
	p := msgSlices.Get().(*[]*driver.Message)
	ms := (*p)[:0]
	for _, s := range ss {
		ms = append(ms, s.H.M)
	}
	*p = ms
	return p
}

func putMessages(p *[]*driver.Message) {
	clear(*p)
	if cap(*p) <= 4096 {
		msgSlices.Put(p)
	}
}

// errorAt is the error of the i-th message of a call of n that returned
// err.
func errorAt(err error, i, n int) error {
	if err == nil {
		return nil
	}
	var p *driver.Partial
	if errors.As(err, &p) && len(p.Errs) == n {
		return p.Errs[i]
	}
	return err
}

func (f *Flow) report(ss []Settlement, err error, done Done) {
	for i, s := range ss {
		f.finish(s, errorAt(err, i, len(ss)), done)
	}
}

// finish reports s's result, wakes its deliver call and frees its room.
func (f *Flow) finish(s Settlement, err error, done Done) {
	if done != nil {
		done(s, err)
	}
	if s.H.done != nil {
		close(s.H.done)
	}
	f.win.give(1)
}

// waited is a group of retries waiting out one delay.
type waited struct {
	ss   []Settlement
	done Done
}

// waitLocked holds ss, retries the broker cannot delay, until their delay
// passed, then sends them with Retry(0); Close sends them at once.
func (f *Flow) waitLocked(ss []Settlement, done Done) {
	for len(ss) > 0 {
		n := 1
		for n < len(ss) && ss[n].Delay == ss[0].Delay {
			n++
		}
		w := &waited{ss: ss[:n:n], done: done}
		ss = ss[n:]
		if f.timers == nil {
			f.timers = map[*time.Timer]*waited{}
		}
		f.waits.Add(1)
		var t *time.Timer
		f.timerMu.Lock() // t is set before the timer func reads it
		t = time.AfterFunc(w.ss[0].Delay, func() {
			defer f.waits.Done()
			f.timerMu.Lock()
			f.timerMu.Unlock()
			f.mu.Lock()
			w, ok := f.timers[t]
			delete(f.timers, t)
			f.mu.Unlock()
			if ok {
				f.sendWaited(w)
			}
		})
		f.timerMu.Unlock()
		f.timers[t] = w
	}
}

// sendWaited sends retries whose delay passed with no further delay.
func (f *Flow) sendWaited(w *waited) {
	var b batch
	now := time.Now()
	f.mu.Lock()
	for _, s := range w.ss {
		s.H.waiting = false
		if err := f.untrackLocked(s.H, now); err != nil {
			b.stale(s, err)
			continue
		}
		b.backs = append(b.backs, s)
	}
	abandon := f.untoldLocked(b.now)
	f.mu.Unlock()
	if len(abandon) > 0 {
		f.ab.Abandon(context.Background(), abandon)
	}
	for _, r := range b.now {
		f.finish(r.s, r.err, w.done)
	}
	if len(b.backs) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		defer cancel()
		ms := messages(b.backs)
		f.report(b.backs, f.src.Retry(ctx, *ms, 0), w.done)
		putMessages(ms)
	}
}

// settleTimeout bounds the Retry of a retry that waited out its delay.
const settleTimeout = 30 * time.Second

// beat extends the leases of held messages whose deadline is within
// margin, and marks those whose lease lapsed stale (telling an Abandoner).
func (f *Flow) beat(ctx context.Context, margin time.Duration) {
	now := time.Now()
	maxExt, lease := f.traits.MaxExtension, f.traits.Lease
	var due, lapsed []*Held
	f.mu.Lock()
	for h := f.list.next; h != &f.list; h = h.next {
		switch {
		case h.stale != nil:
		case !now.Before(h.deadline):
			h.stale = ErrLeaseLapsed
			if !h.told && f.ab != nil {
				h.told = true
				lapsed = append(lapsed, h)
			}
		case h.waiting || f.ext == nil || maxExt < 0 || h.deadline.Sub(now) > margin:
		case maxExt > 0 && !now.Before(h.received.Add(maxExt)):
		default:
			due = append(due, h)
		}
	}
	f.mu.Unlock()
	if len(lapsed) > 0 && f.ab != nil {
		f.ab.Abandon(ctx, heldMessages(lapsed))
	}
	if len(due) == 0 {
		return
	}
	sent := time.Now()
	ectx, cancel := context.WithTimeout(ctx, lease/3+time.Second)
	err := f.ext.Extend(ectx, heldMessages(due))
	cancel()
	failed := 0
	var last error
	confirmed := time.Now()
	f.mu.Lock()
	for i, h := range due {
		if e := errorAt(err, i, len(due)); e != nil {
			failed++
			last = e
			if errors.Is(e, driver.ErrStaleDelivery) && h.stale == nil {
				h.stale = e // the broker no longer knows this delivery
			}
			continue
		}
		if !confirmed.Before(h.deadline) {
			// Confirmed only after the lease passed (the request waited
			// out an outage): the broker may have redelivered first.
			continue
		}
		until := sent.Add(lease)
		if capAt := h.received.Add(maxExt); maxExt > 0 && capAt.Before(until) {
			until = capAt
		}
		if h.deadline.Before(until) {
			h.deadline = until
		}
	}
	f.mu.Unlock()
	if failed > 0 {
		f.log.Warn("idemq: extending leases failed; trying again next beat", "messages", failed, "of", len(due), "err", last)
	}
}

func heldMessages(hs []*Held) []*driver.Message {
	ms := make([]*driver.Message, len(hs))
	for i, h := range hs {
		ms[i] = h.M
	}
	return ms
}

// release hands ms back undecided, where the source can (Releaser); the
// broker redelivers the others by itself.
func (f *Flow) release(ctx context.Context, ms []*driver.Message) error {
	if r, ok := f.src.(driver.Releaser); ok {
		return r.Release(ctx, ms)
	}
	return nil
}

// Close stops the heartbeat, releases everything still held (retries
// waiting out their delay included) in one call, so the broker redelivers
// them at once, and closes the source. Settling a given-back
// message later returns a stale error. ctx bounds the give-back.
func (f *Flow) Close(ctx context.Context) error {
	type left struct {
		s    Settlement
		done Done
		err  error // stale: not given back
	}
	var all []left
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	now := time.Now()
	for t, w := range f.timers {
		if t.Stop() {
			f.waits.Done()
		}
		for _, s := range w.ss {
			s.H.waiting = false
			all = append(all, left{s, w.done, f.untrackLocked(s.H, now)})
		}
	}
	clear(f.timers)
	for h := f.list.next; h != &f.list; {
		next := h.next
		if h.state.CompareAndSwap(held, givenBack) {
			all = append(all, left{Settlement{H: h, Kind: Release}, nil, f.untrackLocked(h, now)})
		}
		h = next
	}
	var stale []result
	for _, l := range all {
		if l.err != nil {
			stale = append(stale, result{l.s, driver.Stale(l.err)})
		}
	}
	abandon := f.untoldLocked(stale)
	f.mu.Unlock()
	f.stopBeat()
	f.beating.Wait()
	f.waits.Wait()
	if len(abandon) > 0 {
		f.ab.Abandon(ctx, abandon)
	}
	var back []left
	for _, l := range all {
		if l.err != nil {
			f.finish(l.s, driver.Stale(l.err), l.done)
		} else {
			back = append(back, l)
		}
	}
	var err error
	if len(back) > 0 {
		ms := make([]*driver.Message, len(back))
		for i, l := range back {
			ms[i] = l.s.H.M
		}
		rerr := f.release(ctx, ms)
		for i, l := range back {
			f.finish(l.s, errorAt(rerr, i, len(back)), l.done)
		}
		if rerr != nil && !errors.Is(rerr, driver.ErrStaleDelivery) {
			err = rerr
		}
	}
	return errors.Join(err, f.src.Close())
}

// window counts the room left for held messages.
type window struct {
	mu   sync.Mutex
	free int
	wake chan struct{} // capacity 1: a wake-up is never lost nor blocks
}

func (w *window) init(n int) { w.free, w.wake = n, make(chan struct{}, 1) }

// take waits until there is room and takes up to n of it, at least one.
func (w *window) take(ctx context.Context, n int) (int, error) {
	for {
		w.mu.Lock()
		if w.free > 0 {
			got := min(w.free, max(n, 1))
			w.free -= got
			more := w.free > 0
			w.mu.Unlock()
			if more {
				w.signal() // another taker may use the rest
			}
			return got, nil
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// takeMore takes up to n more room as it frees within linger (or until
// ctx ends), and returns how much it took.
func (w *window) takeMore(ctx context.Context, n int, linger time.Duration) int {
	t := time.NewTimer(linger)
	defer t.Stop()
	got := 0
	for got < n {
		w.mu.Lock()
		k := min(w.free, n-got)
		w.free -= k
		w.mu.Unlock()
		if got += k; got == n {
			break
		}
		select {
		case <-w.wake:
		case <-t.C:
			return got
		case <-ctx.Done():
			return got
		}
	}
	return got
}

// give returns n of room.
func (w *window) give(n int) {
	if n <= 0 {
		return
	}
	w.mu.Lock()
	w.free += n
	w.mu.Unlock()
	w.signal()
}

func (w *window) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
