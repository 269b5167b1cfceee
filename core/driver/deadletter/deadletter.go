// Package deadletter is the dead-letter half of the delivery kit. A broker
// adapter supplies how its parked copies are read, republished and removed
// (a Store); Queue gives operators admin.DeadLetterQueue over it, with the
// selection, progress, counts and error wording written once. Mark, Read
// and Strip write and read the bookkeeping headers every broker records on
// a parked copy, under core/driver's names.
package deadletter

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/admin"
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
	Each(ctx context.Context, fn func(ref R, p *admin.Parked) error) error
	// Republish publishes p to p.Destination, with p.Headers (the
	// bookkeeping headers already left out), and returns once the broker
	// confirmed the publish.
	Republish(ctx context.Context, ref R, p *admin.Parked) error
	// Remove deletes the parked copy.
	Remove(ctx context.Context, ref R) error
	// Close releases the store's connections.
	Close() error
}

// Queue is the admin.DeadLetterQueue over a Store. Adapters embed it in
// their exported DeadLetters type.
type Queue[R any] struct{ s Store[R] }

// New returns the Queue over s.
func New[R any](s Store[R]) *Queue[R] { return &Queue[R]{s} }

var _ admin.DeadLetterQueue = (*Queue[int])(nil)

// Name implements admin.DeadLetterQueue.
func (q *Queue[R]) Name() string { return q.s.Name() }

// Close implements admin.DeadLetterQueue.
func (q *Queue[R]) Close() error { return q.s.Close() }

// Scan implements admin.DeadLetterQueue.
func (q *Queue[R]) Scan(ctx context.Context, fn func(*admin.Parked) error) error {
	return q.s.Each(ctx, func(_ R, p *admin.Parked) error { return fn(p) })
}

// Redrive implements admin.DeadLetterQueue: each copy sel chooses is
// republished without the bookkeeping headers, then removed; a copy with
// no destination stops the call with an error naming it.
func (q *Queue[R]) Redrive(ctx context.Context, sel func(*admin.Parked) bool, progress func(done int)) (int, error) {
	done := 0
	err := q.s.Each(ctx, func(ref R, p *admin.Parked) error {
		if sel != nil && !sel(p) {
			return nil
		}
		if p.Destination == "" {
			return fmt.Errorf("dead letter %s (ref %s) in %s has no %s to redrive it to", name(p), p.Ref, q.s.Name(), driver.DestinationHeader)
		}
		c := *p
		c.Headers = Strip(p.Headers)
		if err := q.s.Republish(ctx, ref, &c); err != nil {
			return fmt.Errorf("redriving dead letter %s (ref %s) to %s: %w", name(p), p.Ref, p.Destination, err)
		}
		if err := q.s.Remove(ctx, ref); err != nil {
			return fmt.Errorf("dead letter %s (ref %s) redriven to %s, but removing it from %s failed: %w", name(p), p.Ref, p.Destination, q.s.Name(), err)
		}
		done++
		if progress != nil {
			progress(done)
		}
		return nil
	})
	return done, err
}

// Purge implements admin.DeadLetterQueue.
func (q *Queue[R]) Purge(ctx context.Context, sel func(*admin.Parked) bool) (int, error) {
	done := 0
	err := q.s.Each(ctx, func(ref R, p *admin.Parked) error {
		if sel != nil && !sel(p) {
			return nil
		}
		if err := q.s.Remove(ctx, ref); err != nil {
			return fmt.Errorf("purging dead letter %s (ref %s) from %s: %w", name(p), p.Ref, q.s.Name(), err)
		}
		done++
		return nil
	})
	return done, err
}

func name(p *admin.Parked) string {
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
func Read(p *admin.Parked) {
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
