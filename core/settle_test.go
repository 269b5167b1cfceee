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

// Ack acknowledges the others of ms first; the stalled message's ack then
// waits until every other message was acknowledged.
func (s *stallingSource) Ack(ctx context.Context, ms []*driver.Message) error {
	var stalled, others []*driver.Message
	for _, m := range ms {
		if m.ID == s.stallID {
			stalled = append(stalled, m)
		} else {
			others = append(others, m)
		}
	}
	if len(others) > 0 {
		if err := s.Subscription.Ack(ctx, others); err != nil {
			return err
		}
		if s.acked.Add(int64(len(others))) == s.others {
			close(s.release)
		}
	}
	if len(stalled) == 0 {
		return nil
	}
	select {
	case <-s.release:
	case <-time.After(10 * time.Second):
		s.gaveUp.Store(true)
	}
	return s.Subscription.Ack(ctx, stalled)
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

// wrappedSource is a memory subscription with one thing changed, for
// tests of how the Consumer meets an adapter: what it receives, or how it
// parks.
type wrappedSource struct {
	*memory.Subscription
	onReceive  func(m *driver.Message) // changes each received message
	deadLetter func(ctx context.Context, s *memory.Subscription, ms []*driver.Message, causes []error) error
}

func (s wrappedSource) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	ms, err := s.Subscription.Receive(ctx, max)
	if s.onReceive != nil {
		for _, m := range ms {
			s.onReceive(m)
		}
	}
	return ms, err
}

func (s wrappedSource) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	if s.deadLetter != nil {
		return s.deadLetter(ctx, s.Subscription, ms, causes)
	}
	return s.Subscription.DeadLetter(ctx, ms, causes)
}

// runUntilParked runs a Consumer of e's queue through wrap until a message
// is dead-lettered, and returns its stats.
func runUntilParked(t *testing.T, e *env, src wrappedSource, h core.Handler[*sql.Tx]) core.Stats {
	t.Helper()
	sub, err := e.broker.Subscribe(e.queue)
	if err != nil {
		t.Fatal(err)
	}
	src.Subscription = sub
	c, err := core.New[*sql.Tx](src, e.store, h, core.WithName("test"), core.WithLogger(quietLogger()))
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

// parkFailing fails the first fails dead-letter settlements, as a broker
// whose dead-letter queue is briefly unreachable does: those are left
// unsettled, their lease runs out and the message comes back.
func parkFailing(fails *atomic.Int64) wrappedSource {
	return wrappedSource{deadLetter: func(ctx context.Context, s *memory.Subscription, ms []*driver.Message, causes []error) error {
		errs := make([]error, len(ms))
		var park []*driver.Message
		var parkCauses []error
		for i, m := range ms {
			if fails.Add(-1) >= 0 {
				errs[i] = errors.New("dead-letter queue unreachable")
				continue
			}
			park, parkCauses = append(park, m), append(parkCauses, causes[i])
		}
		if len(park) > 0 {
			if err := s.DeadLetter(ctx, park, parkCauses); err != nil {
				return err
			}
		}
		return driver.PartialOf(errs)
	}}
}

// A message counts as dead-lettered once it is parked, not once per failed
// attempt to park it.
func TestDeadLetteredCountsParkedMessagesOnce(t *testing.T) {
	e := newEnv(t, memory.WithVisibilityTimeout(100*time.Millisecond))
	e.publish("poison")
	var fails atomic.Int64
	fails.Store(3)
	poison := func(context.Context, *sql.Tx, *core.Message) error { return core.Permanent(errors.New("bad payload")) }
	st := runUntilParked(t, e, parkFailing(&fails), poison)
	if n := len(e.broker.DeadLetters(e.queue)); n != 1 {
		t.Fatalf("%d messages parked, want 1 (broker %+v)", n, e.broker.Stats(e.queue))
	}
	if st.DeadLettered != 1 || st.SettleErrors != 3 {
		t.Fatalf("Stats: DeadLettered %d, SettleErrors %d; want 1 parked after 3 failed parks", st.DeadLettered, st.SettleErrors)
	}
}

// The adapter's reason for an unusable id is the dead letter's cause.
func TestDeadLetterCauseSaysWhyTheIDWasUnusable(t *testing.T) {
	e := newEnv(t)
	e.publish("x")
	// The adapter could not use the id it found (Message.IDError), as a
	// header of the wrong type.
	runUntilParked(t, e, wrappedSource{onReceive: func(m *driver.Message) {
		m.ID, m.IDError = "", errors.New(`id header "MessageId" holds a bool`)
	}}, applyEffect)
	dls := e.broker.DeadLetters(e.queue)
	if len(dls) != 1 || !errors.Is(dls[0].Cause, core.ErrMissingID) || !strings.Contains(dls[0].Cause.Error(), `holds a bool`) {
		t.Fatalf("dead letters %v: want one whose cause is ErrMissingID with the adapter's reason", dls)
	}
}

// A message the adapter could not read whole (Message.Unreadable) is
// dead-lettered with that cause; its handler never runs.
func TestUnreadableMessageIsDeadLettered(t *testing.T) {
	e := newEnv(t)
	e.publish("x")
	var ran atomic.Bool
	runUntilParked(t, e, wrappedSource{onReceive: func(m *driver.Message) {
		m.Unreadable = errors.New(`entry has no "body" field (body_field=body)`)
	}}, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		ran.Store(true)
		return applyEffect(ctx, tx, m)
	})
	dls := e.broker.DeadLetters(e.queue)
	var de *core.DecisionError
	if len(dls) != 1 || !errors.As(dls[0].Cause, &de) || de.Stage != core.StageDecode || !strings.Contains(dls[0].Cause.Error(), "body_field=body") {
		t.Fatalf("dead letters %v: want one decided at the decode stage with the adapter's cause", dls)
	}
	if ran.Load() {
		t.Fatal("the handler ran for an unreadable message")
	}
}
