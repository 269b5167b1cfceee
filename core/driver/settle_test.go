package driver

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

func TestSettleOnceLetsExactlyOneClaimWin(t *testing.T) {
	var s SettleOnce
	var wins atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if err := s.Claim(); err == nil {
				wins.Add(1)
			} else if !errors.Is(err, ErrAlreadySettled) {
				t.Errorf("Claim: %v, want ErrAlreadySettled", err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 || !s.Settled() {
		t.Fatalf("%d claims won, settled %v; want exactly one and settled", wins.Load(), s.Settled())
	}
}

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
