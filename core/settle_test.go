package core_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/drain"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
)

// stallingSource holds the Ack of one message until the others are all
// acknowledged: a broker call that hangs must not hold up the settlement
// of anything else.
type stallingSource struct {
	*memory.Subscription
	stallID string
	others  int64
	acked   atomic.Int64
	release chan struct{}
	gaveUp  atomic.Bool // the stalled Ack stopped waiting: the others were held up
}

func (s *stallingSource) Receive(ctx context.Context) (driver.Delivery, error) {
	d, err := s.Subscription.Receive(ctx)
	if err != nil {
		return nil, err
	}
	return &stallingDelivery{Delivery: d, s: s}, nil
}

type stallingDelivery struct {
	driver.Delivery
	s *stallingSource
}

func (d *stallingDelivery) Ack(ctx context.Context) error {
	if d.Message().ID == d.s.stallID {
		select {
		case <-d.s.release:
		case <-time.After(10 * time.Second):
			d.s.gaveUp.Store(true)
		}
	} else if d.s.acked.Add(1) == d.s.others {
		close(d.s.release)
	}
	return d.Delivery.Ack(ctx)
}

func TestStalledSettlementDoesNotHoldUpOthers(t *testing.T) {
	for _, pl := range pipelines {
		t.Run(pl.name, func(t *testing.T) {
			e := newEnv(t)
			want := ids(20, "s")
			e.publish(want...)
			src := &stallingSource{stallID: want[0], others: int64(len(want) - 1), release: make(chan struct{})}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			_, err := drain.Drain(ctx, e.broker, e.queue, func(sub *memory.Subscription) (*core.Consumer[*sql.Tx], error) {
				src.Subscription = sub
				return core.New[*sql.Tx](src, e.store, applyEffect, append([]core.Option{
					core.WithName("test"), core.WithLogger(quietLogger()), core.WithWindow(len(want)), core.WithConcurrency(4)}, pl.opts...)...)
			})
			if err != nil {
				t.Fatal(err)
			}
			if src.gaveUp.Load() {
				t.Fatalf("the other %d acks did not all arrive while one was stalled (drained after %v)", src.others, time.Since(start))
			}
			e.assertExactlyOnce(want)
		})
	}
}

// wrappedSource is a memory subscription whose deliveries pass through
// wrap, for tests that change one thing about an adapter.
type wrappedSource struct {
	*memory.Subscription
	wrap func(driver.Delivery) driver.Delivery
}

func (s wrappedSource) Receive(ctx context.Context) (driver.Delivery, error) {
	d, err := s.Subscription.Receive(ctx)
	if err != nil {
		return nil, err
	}
	return s.wrap(d), nil
}

// runUntilParked runs a Consumer of e's queue through wrap until a message
// is dead-lettered, and returns its stats.
func runUntilParked(t *testing.T, e *env, wrap func(driver.Delivery) driver.Delivery, h core.Handler[*sql.Tx]) core.Stats {
	t.Helper()
	sub, err := e.broker.Subscribe(e.queue)
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New[*sql.Tx](wrappedSource{sub, wrap}, e.store, h, core.WithName("test"), core.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for len(e.broker.DeadLetters(e.queue)) == 0 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return c.Stats()
}

// parkFailing fails the first fails DeadLetter settlements, as a broker
// whose dead-letter queue is briefly unreachable does.
type parkFailing struct {
	driver.Delivery
	fails *atomic.Int64
}

func (d parkFailing) DeadLetter(ctx context.Context, cause error) error {
	if d.fails.Add(-1) >= 0 {
		// Left unsettled: the lease runs out and the message comes back.
		return errors.New("dead-letter queue unreachable")
	}
	return d.Delivery.DeadLetter(ctx, cause)
}

// A message counts as dead-lettered once it is parked, not once per failed
// attempt to park it.
func TestDeadLetteredCountsParkedMessagesOnce(t *testing.T) {
	e := newEnv(t, memory.WithVisibilityTimeout(100*time.Millisecond))
	e.publish("poison")
	var fails atomic.Int64
	fails.Store(3)
	poison := func(context.Context, *sql.Tx, *core.Message) error { return core.Permanent(errors.New("bad payload")) }
	st := runUntilParked(t, e, func(d driver.Delivery) driver.Delivery { return parkFailing{d, &fails} }, poison)
	if n := len(e.broker.DeadLetters(e.queue)); n != 1 {
		t.Fatalf("%d messages parked, want 1", n)
	}
	if st.DeadLettered != 1 || st.SettleErrors != 3 {
		t.Fatalf("Stats: DeadLettered %d, SettleErrors %d; want 1 parked after 3 failed parks", st.DeadLettered, st.SettleErrors)
	}
}

// unreadableID is a delivery whose adapter could not use the id it found
// (driver.IDErrorer), as a header of the wrong type.
type unreadableID struct {
	driver.Delivery
	m *driver.Message
}

func (d unreadableID) Message() *driver.Message { return d.m }
func (d unreadableID) IDError() error           { return errors.New(`id header "MessageId" holds a bool`) }

// The adapter's reason for an unusable id is the dead letter's cause.
func TestDeadLetterCauseSaysWhyTheIDWasUnusable(t *testing.T) {
	e := newEnv(t)
	e.publish("x")
	runUntilParked(t, e, func(d driver.Delivery) driver.Delivery {
		m := *d.Message()
		m.ID = ""
		return unreadableID{d, &m}
	}, applyEffect)
	dls := e.broker.DeadLetters(e.queue)
	if len(dls) != 1 || !errors.Is(dls[0].Cause, core.ErrMissingID) || !strings.Contains(dls[0].Cause.Error(), `holds a bool`) {
		t.Fatalf("dead letters %v: want one whose cause is ErrMissingID with the adapter's reason", dls)
	}
}
