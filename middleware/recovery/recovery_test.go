package recovery_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/recovery"
)

func TestRecoverTurnsPanicIntoTransientError(t *testing.T) {
	var logs bytes.Buffer
	mw := recovery.New(slog.New(slog.NewTextHandler(&logs, nil)))
	h := mw(func(context.Context, []*core.Message) error { panic("kaboom") })
	err := h(context.Background(), []*core.Message{{ID: "m-1"}})
	var pe *recovery.PanicError
	if !errors.As(err, &pe) || pe.Value != "kaboom" || len(pe.Stack) == 0 || core.IsPermanent(err) {
		t.Fatalf("err = %#v, want a transient *PanicError with the value and stack", err)
	}
	if s := logs.String(); !strings.Contains(s, "kaboom") || !strings.Contains(s, "m-1") || !strings.Contains(s, "recovery_test.go") {
		t.Errorf("log lacks the panic, id or stack: %s", s)
	}
	ok := mw(func(context.Context, []*core.Message) error { return nil })
	if err := ok(context.Background(), []*core.Message{{}}); err != nil {
		t.Errorf("no panic: %v", err)
	}
}
