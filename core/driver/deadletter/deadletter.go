// Package deadletter is the dead-letter half of the delivery kit. A broker
// adapter supplies how its parked copies are read, republished and removed
// (a Store); Queue gives operators driver.DeadLetters over it, with the
// selection, progress, counts and error wording written once. Mark, Read
// and Strip write and read the bookkeeping headers every broker records on
// a parked copy, under core/driver's names.
package deadletter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// Store is a broker's dead-letter queue as Queue needs it. R identifies one
// parked copy for Republish and Remove (a sequence, an entry id, a held
// delivery). Methods are called from one goroutine at a time.
type Store[R any] interface {
	// Name is the dead-letter queue, topic or stream, as operators know it.
	Name() string
	// Each calls fn with each copy parked when it began, oldest first
	// where the broker keeps an order, until fn returns an error (which
	// Each returns) or the copies run out. Republish and Remove may be
	// called from inside fn for the copy fn was given.
	Each(ctx context.Context, fn func(ref R, p *driver.Parked) error) error
	// Republish publishes p to p.Destination, with p.Headers (the
	// bookkeeping headers already left out), and returns once the broker
	// confirmed the publish.
	Republish(ctx context.Context, ref R, p *driver.Parked) error
	// Remove deletes the parked copy.
	Remove(ctx context.Context, ref R) error
	// Close releases the store's connections.
	Close() error
}

// BatchStore is a dead-letter queue that hands out and deletes parked
// copies several at a time (SQS: a receive brings up to ten, and
// DeleteMessageBatch deletes ten), as Queue needs it: Redrive and Purge
// then delete each batch's chosen copies in one request.
type BatchStore[R any] interface {
	// Name, Republish and Close are as a Store's.
	Name() string
	Republish(ctx context.Context, ref R, p *driver.Parked) error
	Close() error
	// EachBatch is Store.Each a batch at a time: fn gets copies the store
	// holds until fn returns, for Republish and RemoveBatch.
	EachBatch(ctx context.Context, fn func(refs []R, ps []*driver.Parked) error) error
	// RemoveBatch deletes refs, some of one batch EachBatch gave, and
	// returns one error per ref: nil where the copy was deleted.
	RemoveBatch(ctx context.Context, refs []R) []error
}

// Queue is the driver.DeadLetters over a Store or a BatchStore.
// Adapters embed it in their exported DeadLetters type.
type Queue[R any] struct{ s BatchStore[R] }

// New returns the Queue over s.
func New[R any](s Store[R]) *Queue[R] { return &Queue[R]{oneByOne[R]{s}} }

// NewBatched returns the Queue over s.
func NewBatched[R any](s BatchStore[R]) *Queue[R] { return &Queue[R]{s} }

// oneByOne is a Store as a BatchStore of batches of one.
type oneByOne[R any] struct{ Store[R] }

func (o oneByOne[R]) EachBatch(ctx context.Context, fn func([]R, []*driver.Parked) error) error {
	return o.Each(ctx, func(ref R, p *driver.Parked) error { return fn([]R{ref}, []*driver.Parked{p}) })
}

func (o oneByOne[R]) RemoveBatch(ctx context.Context, refs []R) []error {
	errs := make([]error, len(refs))
	for i, ref := range refs {
		errs[i] = o.Remove(ctx, ref)
	}
	return errs
}

var (
	_ driver.DeadLetters = (*Queue[int])(nil)
	_ driver.Redriver    = (*Queue[int])(nil)
)

// Name implements driver.DeadLetters.
func (q *Queue[R]) Name() string { return q.s.Name() }

// Close implements driver.DeadLetters.
func (q *Queue[R]) Close() error { return q.s.Close() }

// Scan implements driver.DeadLetters.
func (q *Queue[R]) Scan(ctx context.Context, fn func(*driver.Parked) error) error {
	return q.s.EachBatch(ctx, func(_ []R, ps []*driver.Parked) error {
		for _, p := range ps {
			if err := fn(p); err != nil {
				return err
			}
		}
		return nil
	})
}

// Redrive implements driver.Redriver: each copy sel chooses is
// republished without the bookkeeping headers, then removed (a batch's
// together); a copy with no destination stops the call with an error
// naming it.
func (q *Queue[R]) Redrive(ctx context.Context, sel func(*driver.Parked) bool, progress func(done int)) (int, error) {
	done := 0
	err := q.s.EachBatch(ctx, func(refs []R, ps []*driver.Parked) error {
		var sent []R
		var sentPs []*driver.Parked
		var stop error
		for i, p := range ps {
			if sel != nil && !sel(p) {
				continue
			}
			if p.Destination == "" {
				stop = fmt.Errorf("dead letter %s (ref %s) in %s has no %s to redrive it to", name(p), p.Ref, q.s.Name(), driver.DestinationHeader)
				break
			}
			c := *p
			c.Headers = Strip(p.Headers)
			if err := q.s.Republish(ctx, refs[i], &c); err != nil {
				stop = fmt.Errorf("redriving dead letter %s (ref %s) to %s: %w", name(p), p.Ref, p.Destination, err)
				break
			}
			sent, sentPs = append(sent, refs[i]), append(sentPs, p)
		}
		// What was republished is removed even when a later copy stopped
		// the call.
		return errors.Join(q.remove(ctx, sent, sentPs, &done, progress, func(p *driver.Parked, err error) error {
			return fmt.Errorf("dead letter %s (ref %s) redriven to %s, but removing it from %s failed: %w", name(p), p.Ref, p.Destination, q.s.Name(), err)
		}), stop)
	})
	return done, err
}

// Purge implements driver.DeadLetters: it removes each copy sel
// chooses, a batch's together.
func (q *Queue[R]) Purge(ctx context.Context, sel func(*driver.Parked) bool) (int, error) {
	done := 0
	err := q.s.EachBatch(ctx, func(refs []R, ps []*driver.Parked) error {
		var chosen []R
		var chosenPs []*driver.Parked
		for i, p := range ps {
			if sel == nil || sel(p) {
				chosen, chosenPs = append(chosen, refs[i]), append(chosenPs, p)
			}
		}
		return q.remove(ctx, chosen, chosenPs, &done, nil, func(p *driver.Parked, err error) error {
			return fmt.Errorf("purging dead letter %s (ref %s) from %s: %w", name(p), p.Ref, q.s.Name(), err)
		})
	})
	return done, err
}

// remove deletes refs (ps are their copies), counting each deletion in
// done and reporting it to progress; failed words the error of a copy not
// deleted.
func (q *Queue[R]) remove(ctx context.Context, refs []R, ps []*driver.Parked, done *int, progress func(int), failed func(*driver.Parked, error) error) error {
	if len(refs) == 0 {
		return nil
	}
	var errs []error
	for i, err := range q.s.RemoveBatch(ctx, refs) {
		if err != nil {
			errs = append(errs, failed(ps[i], err))
			continue
		}
		if *done++; progress != nil {
			progress(*done)
		}
	}
	return errors.Join(errs...)
}

func name(p *driver.Parked) string {
	if p.ID == "" {
		return "(no id)"
	}
	return strconv.Quote(p.ID)
}

// Cause returns the text a parked copy records for cause: its message on
// one line (a header value must not break, and `idemq dlq list` shows a
// cause a line), or "no cause given" when there is none.
func Cause(cause error) string {
	if cause == nil || cause.Error() == "" {
		return "no cause given"
	}
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(cause.Error())
}

// Mark is what a parked copy records beside the message's own headers.
type Mark struct {
	Cause       string    // why it was parked
	Attempt     int       // the delivery attempt it was parked at, 0 if unknown
	Origin      string    // where it was consumed, in the broker's terms
	Destination string    // where a redrive publishes it
	At          time.Time // when it was parked
}

// Headers returns the bookkeeping headers of m, leaving out the empty ones.
func (m Mark) Headers() map[string]string {
	h := make(map[string]string, 5)
	put := func(k, v string) {
		if v != "" {
			h[k] = v
		}
	}
	put(driver.CauseHeader, m.Cause)
	if m.Attempt > 0 {
		put(driver.AttemptHeader, strconv.Itoa(m.Attempt))
	}
	put(driver.OriginHeader, m.Origin)
	put(driver.DestinationHeader, m.Destination)
	if !m.At.IsZero() {
		put(driver.ParkedAtHeader, m.At.UTC().Format(time.RFC3339Nano))
	}
	return h
}

// Bookkeeping lists the headers Mark writes and Strip leaves out.
var Bookkeeping = []string{driver.CauseHeader, driver.AttemptHeader, driver.OriginHeader, driver.ParkedAtHeader, driver.DestinationHeader}

// Strip returns a copy of h without the bookkeeping headers and the extra
// ones named (a broker's own, such as AMQP's x-death).
func Strip(h map[string]string, extra ...string) map[string]string {
	c := maps.Clone(h)
	for _, k := range Bookkeeping {
		delete(c, k)
	}
	for _, k := range extra {
		delete(c, k)
	}
	return c
}

// Read fills p's Cause, Attempt, Origin and Destination from the
// bookkeeping headers in p.Headers where p has none yet, and ParkedAt from
// the parked-at header when p has no time or the header's is earlier (a
// broker's own time is never earlier than the truth).
func Read(p *driver.Parked) {
	h := p.Headers
	fill := func(f *string, k string) {
		if *f == "" {
			*f = h[k]
		}
	}
	fill(&p.Cause, driver.CauseHeader)
	fill(&p.Origin, driver.OriginHeader)
	fill(&p.Destination, driver.DestinationHeader)
	if p.Attempt == 0 {
		p.Attempt, _ = strconv.Atoi(h[driver.AttemptHeader])
	}
	if t, err := time.Parse(time.RFC3339Nano, h[driver.ParkedAtHeader]); err == nil && (p.ParkedAt.IsZero() || t.Before(p.ParkedAt)) {
		p.ParkedAt = t
	}
}

// Refs gives parked copies a Ref from their content, for a broker that
// gives a message no lasting id (AMQP's basic.get hands out a delivery tag
// that dies with its channel): the same copy gets the same Ref in every
// call while it stays parked, and identical copies after the first get
// "~2", "~3", … in the order a call meets them. Each makes one per call.
type Refs map[string]int

// Of returns the Ref of a copy made of fields (its properties, headers and
// body, in an order the adapter keeps): 16 hex digits of a SHA-256 over
// the fields, each after its length, so that no two lists of fields
// collide by their joints.
func (r Refs) Of(fields ...string) string {
	h := sha256.New()
	for _, f := range fields {
		fmt.Fprintf(h, "%d:%s", len(f), f)
	}
	ref := hex.EncodeToString(h.Sum(nil)[:8])
	r[ref]++
	if n := r[ref]; n > 1 {
		ref += "~" + strconv.Itoa(n)
	}
	return ref
}
