package unsettled

import (
	"context"
	"sync"

	"github.com/idemq/idemq/core/driver"
)

// Room tells a receiver waiting for room in a source's window that a
// settlement made some. Made never blocks; one receiver waiting on Wait
// (or the next to wait) sees it. Use NewRoom.
type Room chan struct{}

// NewRoom returns a Room.
func NewRoom() Room { return make(Room, 1) }

// Made says a settlement made room.
func (r Room) Made() {
	select {
	case r <- struct{}{}:
	default:
	}
}

// Wait returns r's channel, for a select.
func (r Room) Wait() <-chan struct{} { return r }

// Serial is a source's Receive where one receiver at a time fetches: it
// calls next under mu until next returns a delivery or an error (nil, nil:
// nothing yet, look again), so receivers calling at once take turns.
func Serial(ctx context.Context, mu *sync.Mutex, next func(context.Context) (driver.Delivery, error)) (driver.Delivery, error) {
	for {
		mu.Lock()
		d, err := next(ctx)
		mu.Unlock()
		if d != nil || err != nil {
			return d, err
		}
	}
}
