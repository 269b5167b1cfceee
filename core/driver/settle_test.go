package driver

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

func TestBackoffNeverExceedsItsCapAndResets(t *testing.T) {
	b := NewBackoff(10*time.Millisecond, 80*time.Millisecond)
	first := b.Next()
	if first < 8*time.Millisecond || first > 12*time.Millisecond {
		t.Fatalf("first delay %v, want 10ms ±20%%", first)
	}
	atCap := 0
	for range 1000 {
		d := b.Next()
		if d > 80*time.Millisecond {
			t.Fatalf("delay %v exceeds the cap 80ms", d)
		}
		if d == 80*time.Millisecond {
			atCap++
		}
	}
	if atCap == 0 {
		t.Fatal("no delay reached the cap in 1000 tries")
	}
	b.Reset()
	if d := b.Next(); d > 12*time.Millisecond {
		t.Fatalf("after Reset the delay is %v, want about 10ms", d)
	}
}

func TestSleepStopsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep reported a full hour on a cancelled context")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep(1ms) did not report it slept")
	}
}
