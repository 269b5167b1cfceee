package driver

import (
	"errors"
	"testing"
)

func TestStaleWrapsTheSentinelAndTheReason(t *testing.T) {
	reason := errors.New("channel closed")
	err := Stale(reason)
	if !errors.Is(err, ErrStaleDelivery) || !errors.Is(err, reason) {
		t.Fatalf("Stale(reason) = %v: want it to wrap ErrStaleDelivery and the reason", err)
	}
	if Stale(err) != err {
		t.Fatalf("Stale of a stale error wraps it again: %v", Stale(err))
	}
	if !errors.Is(Stale(nil), ErrStaleDelivery) {
		t.Fatal("Stale(nil) does not wrap ErrStaleDelivery")
	}
}
