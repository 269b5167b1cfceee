package retry

import (
	"context"
	"testing"
	"time"
)

func TestBackoffNeverExceedsItsCapAndResets(t *testing.T) {
	b := New(10*time.Millisecond, 80*time.Millisecond)
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

func TestEveryTicksUntilTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ticks := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, func(time.Time) {
			if ticks++; ticks == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Every did not return after its context ended")
	}
	if ticks < 3 {
		t.Fatalf("%d ticks, want at least 3", ticks)
	}
}
