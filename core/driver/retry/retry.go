// Package retry paces the loops that retry a transport operation (a
// reconnect, a receive, a settlement or publish retry, a relay batch), the
// one backoff helper of the broker adapters (those outside this module
// included), the outbox relay and the Consumer's own loops.
package retry

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Backoff gives the delays of one retry loop: each Next is the next delay,
// growing by 2× from the first delay up to max with ±20% jitter; max caps
// the delay after jitter, so no delay exceeds it. Reset starts over after a
// success. It is cenkalti/backoff's ExponentialBackOff with that cap. A
// Backoff is not safe for concurrent use: each loop owns its own.
type Backoff struct {
	b   backoff.ExponentialBackOff
	max time.Duration
}

// New returns a Backoff whose first delay is about first and whose delays
// never exceed limit (a limit below first is taken as first).
func New(first, limit time.Duration) *Backoff {
	limit = max(first, limit)
	b := &Backoff{max: limit, b: backoff.ExponentialBackOff{
		InitialInterval:     first,
		RandomizationFactor: 0.2,
		Multiplier:          2,
		MaxInterval:         limit,
	}}
	b.b.Reset()
	return b
}

// Next returns the delay before the next try and advances the sequence.
func (b *Backoff) Next() time.Duration { return min(b.b.NextBackOff(), b.max) }

// Reset starts the sequence over at the first delay.
func (b *Backoff) Reset() { b.b.Reset() }

// Wait sleeps for Next and reports whether it did, false when ctx ended
// first.
func (b *Backoff) Wait(ctx context.Context) bool { return Sleep(ctx, b.Next()) }

// Every calls f every interval, with the time of the tick, until ctx ends.
func Every(ctx context.Context, every time.Duration, f func(now time.Time)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			f(now)
		}
	}
}

// Sleep waits d or until ctx is done; it reports whether d elapsed.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
