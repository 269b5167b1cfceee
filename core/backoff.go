package core

import (
	"math"
	"math/rand/v2"
	"time"
)

// Backoff gives the delay before redelivering a message that failed on
// its attempt-th delivery (attempt ≥ 1).
type Backoff interface {
	Delay(attempt int) time.Duration
}

// ExponentialBackoff doubles (by Multiplier) the delay on each attempt,
// from Initial up to Max, spreading each delay by ±Jitter (a fraction) so
// that messages that failed together do not all come back together. Max
// caps every delay, jitter included.
type ExponentialBackoff struct {
	Initial    time.Duration // delay after the first attempt
	Max        time.Duration // cap on any delay
	Multiplier float64       // growth per attempt; < 1 is treated as 1
	Jitter     float64       // 0.2 means ±20%; 0 disables jitter
}

// DefaultBackoff is used when no WithBackoff option is given: 200ms, ×2
// per attempt, capped at 30s, ±20% jitter.
var DefaultBackoff = ExponentialBackoff{Initial: 200 * time.Millisecond, Max: 30 * time.Second, Multiplier: 2, Jitter: 0.2}

// Delay implements Backoff.
func (b ExponentialBackoff) Delay(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	mult := b.Multiplier
	if mult < 1 {
		mult = 1
	}
	d := float64(b.Initial) * math.Pow(mult, float64(attempt-1))
	if b.Max > 0 && d > float64(b.Max) {
		d = float64(b.Max)
	}
	if b.Jitter > 0 {
		d += d * b.Jitter * (2*rand.Float64() - 1)
	}
	// Max caps the delay jitter included.
	if b.Max > 0 && d > float64(b.Max) {
		d = float64(b.Max)
	}
	if d < 0 {
		d = 0
	}
	return time.Duration(d)
}

// ConstantBackoff waits the same delay after every attempt.
type ConstantBackoff time.Duration

// Delay implements Backoff.
func (c ConstantBackoff) Delay(int) time.Duration { return time.Duration(c) }
