package admin

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/registry"
)

// Parked is one dead-lettered message as an operator reads it.
type Parked = driver.Parked

// DeadLetterQueue is an operator's handle on the dead letters of one
// consumer's queue or topic: read them or delete them; Redrive puts them
// back where the adapter can.
type DeadLetterQueue = driver.DeadLetters

// ErrNoRedrive is returned, wrapped, by Redrive for dead letters whose
// adapter cannot put them back (a webhook's parked requests: only the
// sender can send a copy that verifies).
var ErrNoRedrive = errors.New("these dead letters cannot be redriven")

// Redrive publishes each message of q that sel chooses back to its
// Destination (driver.Redriver), and returns how many it redrove. progress,
// if not nil, is called after each. It fails with ErrNoRedrive when q's
// adapter cannot redrive, saying what to do instead where the adapter
// says (an error returned by its Redrive).
func Redrive(ctx context.Context, q DeadLetterQueue, sel func(*Parked) bool, progress func(done int)) (int, error) {
	r, ok := q.(driver.Redriver)
	if !ok {
		return 0, fmt.Errorf("%w: %s", ErrNoRedrive, q.Name())
	}
	return r.Redrive(ctx, sel, progress)
}

// OpenDeadLetters opens the dead-letter queue of the consumer rawURL
// describes: the same URL the consumer's source is opened with
// (core.OpenSource). Errors never contain credentials.
func OpenDeadLetters(ctx context.Context, rawURL string) (DeadLetterQueue, error) {
	q, _, err := registry.Open(registry.DeadLetters, rawURL, "dead-letter queue", func(o any, u *url.URL) (DeadLetterQueue, error) {
		return o.(driver.DeadLettersOpener)(ctx, u, driver.OpenConfig{})
	})
	return q, err
}
