package brokertest

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/inflight"
)

// DefaultWindow is the window of a Receiver started without one.
const DefaultWindow = 100

// Receiver drives a Puller as a Consumer does, one message at a time, for
// an adapter's own tests: its room in the window, the leases it extends,
// the stale settlements it refuses and what it gives back on Close are the
// Consumer's own (the same code runs both). Receive takes room for one
// message; a Delivery's Ack, Retry and DeadLetter settle it through the
// adapter's settlement calls, and AckBatch acks several in one call.
//
// A Pusher runs under a Receiver too: its Serve runs from the start, each
// message it delivers waits for room in the window and is then what
// Receive returns, and the sender's deliver call returns once the message
// is settled.
type Receiver struct {
	flow *inflight.Flow

	pushed  chan *inflight.Held // a Pusher's delivered messages
	stop    context.CancelFunc  // ends a Pusher's Serve
	served  chan error          // Serve's result
	closing chan struct{}
	once    sync.Once
}

// Delivery is one message a Receiver received.
type Delivery struct {
	h *inflight.Held
	r *Receiver
}

// StartReceiver starts src for a Consumer with the given window (0:
// DefaultWindow) and returns a Receiver over it, closed when the test
// ends. A window below 0 fails like a Consumer's would: see NewReceiver.
func StartReceiver(t testing.TB, src driver.Source, window int) *Receiver {
	t.Helper()
	if window == 0 {
		window = DefaultWindow
	}
	r, err := NewReceiver(context.Background(), src, window, slog.Default())
	if err != nil {
		t.Fatalf("brokertest: starting the source with a window of %d: %v", window, err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// NewReceiver starts src for a Consumer with window, logging to log, and
// returns a Receiver over it. It fails when window is below 1 or the
// source's Start fails.
func NewReceiver(ctx context.Context, src driver.Source, window int, log *slog.Logger) (*Receiver, error) {
	f, err := inflight.Start(ctx, src, inflight.Config{Window: window, Logger: log})
	if err != nil {
		return nil, err
	}
	r := &Receiver{flow: f, closing: make(chan struct{}), stop: func() {}}
	if _, ok := src.(driver.Pusher); ok {
		r.pushed = make(chan *inflight.Held, window)
		r.served = make(chan error, 1)
		var sctx context.Context
		sctx, r.stop = context.WithCancel(context.WithoutCancel(ctx))
		go func() {
			r.served <- f.Serve(sctx, func(hs []*inflight.Held) {
				for _, h := range hs {
					r.pushed <- h // the window bounds them: never blocks
				}
			})
		}()
	}
	return r, nil
}

// Source returns the adapter's source.
func (r *Receiver) Source() driver.Source { return r.flow.Source() }

// Traits returns what the source reported when it started.
func (r *Receiver) Traits() driver.Traits { return r.flow.Traits() }

// Receive waits for room in the window and for a message.
func (r *Receiver) Receive(ctx context.Context) (*Delivery, error) {
	if r.pushed != nil {
		select {
		case h := <-r.pushed:
			return &Delivery{h: h, r: r}, nil
		case <-r.closing:
			return nil, driver.ErrSourceClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	hs, err := r.flow.Fetch(ctx, 1)
	if err != nil {
		return nil, err
	}
	return &Delivery{h: hs[0], r: r}, nil
}

// Close gives back what the Receiver holds and closes the source. It is
// safe to call twice.
func (r *Receiver) Close() error {
	r.once.Do(func() { close(r.closing) })
	r.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return r.flow.Close(ctx)
}

// Held returns the number of messages held unsettled.
func (r *Receiver) Held() int { return r.flow.Held() }

// AckBatch acknowledges ds in one settlement, as the Consumer acks a
// batch: one Ack call to the adapter for those not settled before. It
// returns the errors joined.
func (r *Receiver) AckBatch(ctx context.Context, ds []*Delivery) error {
	ss := make([]inflight.Settlement, len(ds))
	for i, d := range ds {
		ss[i] = inflight.Settlement{H: d.h, Kind: inflight.Ack}
	}
	return r.settle(ctx, ss)
}

// settle settles ss and returns their errors joined; a retry the flow
// holds for its delay returns nil at once.
func (r *Receiver) settle(ctx context.Context, ss []inflight.Settlement) error {
	var mu sync.Mutex
	var errs []error
	returned := false
	r.flow.Settle(ctx, ss, func(_ inflight.Settlement, err error) {
		mu.Lock()
		defer mu.Unlock()
		if !returned && err != nil {
			errs = append(errs, err)
		}
	})
	mu.Lock()
	defer mu.Unlock()
	returned = true
	return errors.Join(errs...)
}

// Message returns the received message.
func (d *Delivery) Message() *driver.Message { return d.h.M }

// Ack acknowledges the message.
func (d *Delivery) Ack(ctx context.Context) error {
	return d.r.settle(ctx, []inflight.Settlement{{H: d.h, Kind: inflight.Ack}})
}

// Retry hands the message back for redelivery after delay.
func (d *Delivery) Retry(ctx context.Context, delay time.Duration) error {
	return d.r.settle(ctx, []inflight.Settlement{{H: d.h, Kind: inflight.Retry, Delay: delay}})
}

// DeadLetter parks the message with cause.
func (d *Delivery) DeadLetter(ctx context.Context, cause error) error {
	return d.r.settle(ctx, []inflight.Settlement{{H: d.h, Kind: inflight.DeadLetter, Cause: cause}})
}
