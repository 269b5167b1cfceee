package unsettled_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/unsettled"
)

// Made never blocks, and a waiting receiver sees it once.
func TestRoom(t *testing.T) {
	r := unsettled.NewRoom()
	r.Made()
	r.Made() // a second before anyone waits: still one token, no block
	select {
	case <-r.Wait():
	case <-time.After(time.Second):
		t.Fatal("no token after Made")
	}
	select {
	case <-r.Wait():
		t.Fatal("a second token from two Mades with no receiver between")
	default:
	}
}

// Serial calls next until it returns something, one caller at a time.
func TestSerial(t *testing.T) {
	var mu sync.Mutex
	var calls, inside int
	var d driver.Delivery
	next := func(context.Context) (driver.Delivery, error) {
		inside++
		defer func() { inside-- }()
		if inside != 1 {
			t.Error("next called by two receivers at once")
		}
		calls++
		if calls%3 == 0 {
			return d, context.Canceled // something: stop looking
		}
		return nil, nil
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := unsettled.Serial(context.Background(), &mu, next); err != context.Canceled {
				t.Errorf("Serial: %v", err)
			}
		})
	}
	wg.Wait()
	if calls != 12 {
		t.Errorf("next called %d times, want 12 (three per receiver)", calls)
	}
}
