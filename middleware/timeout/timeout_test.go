package timeout_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/timeout"
)

func TestTimeout(t *testing.T) {
	mw := timeout.New(20 * time.Millisecond)
	m := []*core.Message{{ID: "x"}}
	blocked := mw(func(ctx context.Context, _ []*core.Message) error { <-ctx.Done(); return ctx.Err() })
	if err := blocked(context.Background(), m); !errors.Is(err, timeout.ErrTimeout) || core.IsPermanent(err) {
		t.Errorf("overrunning handler: %v, want transient ErrTimeout", err)
	}
	late := mw(func(ctx context.Context, _ []*core.Message) error { time.Sleep(40 * time.Millisecond); return nil })
	if err := late(context.Background(), m); !errors.Is(err, timeout.ErrTimeout) {
		t.Errorf("handler returning nil after its deadline: %v, want ErrTimeout (its statements may have been cancelled)", err)
	}
	quick := mw(func(ctx context.Context, _ []*core.Message) error {
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("no deadline on the handler's context")
		}
		return nil
	})
	if err := quick(context.Background(), m); err != nil {
		t.Errorf("quick handler: %v", err)
	}
	parent, cancel := context.WithCancel(context.Background())
	cancel()
	if err := blocked(parent, m); errors.Is(err, timeout.ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled parent: %v, want context.Canceled, not a timeout", err)
	}
}

func TestTimeoutRejectsNonPositive(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("timeout.New(0) did not panic")
		}
	}()
	timeout.New(0)
}
