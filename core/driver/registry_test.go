package driver

import (
	"log/slog"
	"testing"
)

// An opener passes the service's logger on as its adapter's option, and
// no option at all when the service gave none.
func TestLoggerOption(t *testing.T) {
	type option func(*slog.Logger) error
	var got *slog.Logger
	with := func(l *slog.Logger) option { return func(*slog.Logger) error { got = l; return nil } }
	if o := LoggerOption(OpenConfig{}, with); o != nil {
		t.Fatal("no logger: an option, want nil")
	}
	l := slog.New(slog.DiscardHandler)
	o := LoggerOption(OpenConfig{Logger: l}, with)
	if o == nil {
		t.Fatal("a logger: no option")
	}
	_ = o(nil)
	if got != l {
		t.Fatalf("the option carries %p, want %p", got, l)
	}
}
