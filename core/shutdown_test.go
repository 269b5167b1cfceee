package core_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
)

// Invariant 8: cancelling Run lets in-flight work finish and be settled.
func TestGracefulShutdownFinishesInFlight(t *testing.T) {
	e := newEnv(t)
	e.publish("slow")
	started := make(chan struct{})
	release := make(chan struct{})
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		close(started)
		<-release
		return applyEffect(ctx, tx, m)
	}
	sub, err := e.broker.Subscribe(e.queue)
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New[*sql.Tx](sub, e.store, h, core.WithName("test"), core.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-started
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned %v before in-flight work finished", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.assertExactlyOnce([]string{"slow"})
	if st := e.broker.Stats(e.queue); st.Acked != 1 || e.broker.Len(e.queue) != 0 {
		t.Errorf("broker stats %+v: want the message acked", st)
	}
}

// Invariant 8 past the deadline: work still running is rolled back and left
// unacknowledged; the next consumer applies it once.
func TestShutdownDeadlineRollsBackAndLeavesUnacked(t *testing.T) {
	e := newEnv(t)
	e.publish("stuck", "quick")
	started := make(chan struct{}, 2)
	var hang atomic.Bool
	hang.Store(true)
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if err := applyEffect(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "stuck" && hang.Load() {
			started <- struct{}{}
			<-ctx.Done() // a handler that honours its context
			return ctx.Err()
		}
		return nil
	}
	sub, err := e.broker.Subscribe(e.queue)
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New[*sql.Tx](sub, e.store, h, core.WithName("test"), core.WithLogger(quietLogger()),
		core.WithShutdownTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-started
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	// "quick" may still wait behind "stuck" (one worker): it is left too,
	// or not received at all before the shutdown.
	if st := c.Stats(); st.Unsettled < 1 || st.Processed+st.Unsettled != st.Received {
		t.Errorf("stats %+v, want the stuck message left unsettled", st)
	}
	if got := e.effects()["stuck"]; got != 0 {
		t.Fatalf("the rolled-back message has %d effects", got)
	}
	if e.broker.Len(e.queue) == 0 {
		t.Fatal("the stuck message is gone from the broker")
	}
	hang.Store(false)
	e.runUntilIdle(30*time.Second, h)
	e.assertExactlyOnce([]string{"stuck", "quick"})
}

// faultyStore wraps a real store and fails commits on demand: before the
// commit (nothing lands) or after it (the commit landed but the caller sees
// an error, as when the connection drops on the way back).
type faultyStore struct {
	driver.Store[*sql.Tx]
	failBefore, failAfter atomic.Int32 // how many commits to fail
}

type faultyTxn struct {
	driver.Txn[*sql.Tx]
	s *faultyStore
}

func (s *faultyStore) Begin(ctx context.Context) (driver.Txn[*sql.Tx], error) {
	t, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &faultyTxn{t, s}, nil
}

func (t *faultyTxn) Commit(ctx context.Context) error {
	if t.s.failBefore.Add(-1) >= 0 {
		t.Txn.Rollback(ctx)
		return errors.New("injected: connection lost before COMMIT")
	}
	if err := t.Txn.Commit(ctx); err != nil {
		return err
	}
	if t.s.failAfter.Add(-1) >= 0 {
		return errors.New("injected: connection lost after COMMIT")
	}
	return nil
}

// Invariant 2: nothing is acked unless its commit succeeded; a commit whose
// outcome is unknown is retried and the store decides Duplicate. The store
// answers probes here, so the first two failures of a transaction run it
// again in place (wantRerun, no delivery spent); a third is handed back to
// the broker (wantRetry).
func TestAckOnlyAfterCommit(t *testing.T) {
	for _, tc := range []struct {
		name                          string
		before, after                 int32
		wantDup, wantRerun, wantRetry int64
	}{
		{"commit-fails", 2, 0, 0, 2, 0},
		{"commit-fails-past-the-reruns", 3, 0, 0, 2, 1},
		{"commit-lands-but-errors", 0, 1, 1, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			fs := &faultyStore{Store: e.store}
			fs.failBefore.Store(tc.before)
			fs.failAfter.Store(tc.after)
			e.publish("m")
			sub, err := e.broker.Subscribe(e.queue)
			if err != nil {
				t.Fatal(err)
			}
			c, err := core.New[*sql.Tx](sub, fs, applyEffect, core.WithName("test"), core.WithLogger(quietLogger()),
				core.WithBackoff(core.ConstantBackoff(time.Millisecond)))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			if err := e.broker.WaitIdle(ctx, e.queue); err != nil {
				t.Fatal(err)
			}
			cancel()
			<-done
			st := c.Stats()
			if st.Retried != tc.wantRetry || st.StoreRetries != tc.wantRerun || st.Duplicates != tc.wantDup || st.Processed != 1-tc.wantDup || st.StoreOutages != 0 {
				t.Errorf("stats %+v", st)
			}
			bs := e.broker.Stats(e.queue)
			if bs.Retried != tc.wantRetry || bs.Acked != 1 {
				t.Errorf("broker stats %+v: want %d retries then one ack", bs, tc.wantRetry)
			}
			e.assertExactlyOnce([]string{"m"})
		})
	}
}

// A consumer crash between commit and ack: the redelivered copies are
// Duplicates.
func TestCrashBetweenCommitAndAck(t *testing.T) {
	e := newEnv(t, memory.WithFaults(memory.Faults{CrashOnAck: 1}))
	want := ids(5, "k")
	e.publish(want...)
	sub, err := e.broker.Subscribe(e.queue)
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New[*sql.Tx](sub, e.store, applyEffect, core.WithName("test"), core.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Run = %v, want ErrCrashed", err)
	}
	committed := len(e.effects())
	if committed == 0 {
		t.Fatal("nothing was committed before the crash")
	}
	if err := e.broker.SetFaults(memory.Faults{}); err != nil {
		t.Fatal(err)
	}
	tot := e.runUntilIdle(30*time.Second, applyEffect)
	if tot.Duplicates < int64(committed) {
		t.Errorf("after the crash %d duplicates, want at least the %d committed before it", tot.Duplicates, committed)
	}
	e.assertExactlyOnce(want)
}

// hangingClose is a source whose Close blocks until released, as a Kafka
// source's does while its group join waits out a dead member's session.
type hangingClose struct {
	*memory.Subscription
	release chan struct{}
}

func (h *hangingClose) Close() error {
	<-h.release
	return h.Subscription.Close()
}

// Shutdown ends within the shutdown timeout even when the source's Close
// blocks: everything decided was settled before, and Run returns.
func TestShutdownDoesNotWaitForABlockedClose(t *testing.T) {
	e := newEnv(t)
	e.publish("a", "b")
	sub, err := e.broker.Subscribe(e.queue)
	if err != nil {
		t.Fatal(err)
	}
	src := &hangingClose{Subscription: sub, release: make(chan struct{})}
	defer close(src.release)
	c, err := core.New[*sql.Tx](src, e.store, applyEffect, core.WithName("test"), core.WithLogger(quietLogger()),
		core.WithShutdownTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for c.Stats().Processed < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // 100× the shutdown timeout: it hangs
		t.Fatal("Run did not return while the source's Close blocked")
	}
	e.assertExactlyOnce([]string{"a", "b"})
}
