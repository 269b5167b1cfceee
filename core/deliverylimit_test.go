package core_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
)

// limitedSource is a memory subscription whose broker, as a Kafka share
// group's does, drops a message after limit deliveries, with an optional
// hint for raising the limit. It counts its Closes.
type limitedSource struct {
	*memory.Subscription
	limit  int
	known  bool
	hint   string
	closes atomic.Int32
}

func (s *limitedSource) DeliveryLimit(context.Context) (int, bool) { return s.limit, s.known }

func (s *limitedSource) DeliveryLimitHint(maxAttempts int) string { return s.hint }

func (s *limitedSource) Close() error {
	s.closes.Add(1)
	return s.Subscription.Close()
}

func newLimitedSource(e *env, limit int, known bool) *limitedSource {
	e.t.Helper()
	sub, err := e.broker.Subscribe(e.queue)
	if err != nil {
		e.t.Fatal(err)
	}
	return &limitedSource{Subscription: sub, limit: limit, known: known}
}

// runLimited runs a Consumer of src until it processed the one message
// published, or Run returned, and returns the log and Run's error.
func runLimited(e *env, src *limitedSource, opts ...core.Option) (string, error) {
	e.t.Helper()
	e.publish("a")
	logs := &syncBuf{}
	c, err := core.New[*sql.Tx](src, e.store, applyEffect, append([]core.Option{core.WithName("test"),
		core.WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for c.Stats().Processed < 1 {
		select {
		case err := <-done:
			return logs.String(), err
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	err = <-done
	return logs.String(), err
}

const limitWarning = "the broker's delivery limit is lower than the Consumer's MaxAttempts"

// A broker that drops a message after fewer deliveries than MaxAttempts
// would lose a failing message before the Consumer dead-letters it: Run
// warns, naming both numbers and the fix, and runs.
func TestDeliveryLimitBelowMaxAttemptsWarns(t *testing.T) {
	e := newEnv(t)
	src := newLimitedSource(e, 3, true)
	src.hint = "kafka-configs --alter --group g --add-config group.share.delivery.count.limit=5"
	logs, err := runLimited(e, src)
	if err != nil {
		t.Fatalf("Run = %v, want it to run after the warning", err)
	}
	if !strings.Contains(logs, limitWarning) {
		t.Fatalf("no delivery-limit warning:\n%s", logs)
	}
	for _, want := range []string{"delivery_limit=3", "max_attempts=5", "WithMaxAttempts(3)", src.hint, "neither applied nor parked"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the warning does not say %q:\n%s", want, logs)
		}
	}
	e.assertExactlyOnce([]string{"a"})
}

// With WithStrictDeliveryLimit, Run refuses to start: it closes the source
// and returns an error naming both numbers and the option.
func TestStrictDeliveryLimitRefusesToStart(t *testing.T) {
	e := newEnv(t)
	src := newLimitedSource(e, 2, true)
	src.hint = "raise group.share.delivery.count.limit"
	_, err := runLimited(e, src, core.WithMaxAttempts(4), core.WithStrictDeliveryLimit())
	if err == nil {
		t.Fatal("Run started, want a refusal")
	}
	for _, want := range []string{"after 2 deliveries", "4 attempts", "WithStrictDeliveryLimit", "WithMaxAttempts(2)", src.hint} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Run = %v, want it to say %q", err, want)
		}
	}
	if n := src.closes.Load(); n != 1 {
		t.Errorf("source closed %d times, want once", n)
	}
	if _, err := src.Receive(context.Background(), 1); !errors.Is(err, core.ErrSourceClosed) {
		t.Errorf("Receive after the refusal = %v, want ErrSourceClosed", err)
	}
}

// A limit at least MaxAttempts loses nothing (the Consumer dead-letters on
// the MaxAttempts-th delivery), and an unknown limit cannot be checked:
// Run starts without a word, strict or not.
func TestDeliveryLimitSilentWhenEnoughOrUnknown(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int
		known bool
	}{
		{"equal", 5, true},
		{"higher", 10, true},
		{"unknown", 0, false},
	} {
		for _, strict := range []bool{false, true} {
			name := tc.name
			if strict {
				name += "/strict"
			}
			t.Run(name, func(t *testing.T) {
				e := newEnv(t)
				src := newLimitedSource(e, tc.limit, tc.known)
				var opts []core.Option
				if strict {
					opts = append(opts, core.WithStrictDeliveryLimit())
				}
				logs, err := runLimited(e, src, opts...)
				if err != nil {
					t.Fatalf("Run = %v, want it to run", err)
				}
				if strings.Contains(logs, "delivery limit") {
					t.Errorf("warned:\n%s", logs)
				}
				e.assertExactlyOnce([]string{"a"})
			})
		}
	}
}

// The equal limit is safe because a message whose handler fails on its
// MaxAttempts-th delivery is dead-lettered then, never retried: the broker
// is not asked for a delivery beyond MaxAttempts.
func TestMaxAttemptsDeadLettersOnTheLastDelivery(t *testing.T) {
	e := newEnv(t)
	e.publish("stuck")
	var calls, last atomic.Int32
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		calls.Add(1)
		last.Store(int32(m.Attempt))
		return errors.New("always down")
	}
	e.runUntilIdle(30*time.Second, h, core.WithMaxAttempts(3), core.WithBackoff(core.ConstantBackoff(time.Millisecond)))
	if dl := e.broker.DeadLetters(e.queue); len(dl) != 1 || !errors.Is(dl[0].Cause, core.ErrMaxAttempts) {
		t.Fatalf("dead letters %+v, want one with ErrMaxAttempts", dl)
	}
	if st := e.broker.Stats(e.queue); st.Delivered != 3 || st.Retried != 2 || st.DeadLettered != 1 {
		t.Errorf("broker stats %+v, want 3 deliveries: 2 retried, the last dead-lettered", st)
	}
	if calls.Load() != 3 || last.Load() != 3 {
		t.Errorf("handler ran %d times, the last on attempt %d; want 3, the last on attempt 3", calls.Load(), last.Load())
	}
}
