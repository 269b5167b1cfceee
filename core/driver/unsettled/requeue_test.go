package unsettled

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestAttemptsRemembersUpToItsBound(t *testing.T) {
	a := NewAttempts[string](2)
	a.Requeued("", 3)
	if a.Last("") != 0 {
		t.Error("a zero key was remembered")
	}
	a.Requeued("a", 1)
	a.Requeued("a", 2)
	if a.Last("a") != 2 || a.Last("b") != 0 {
		t.Errorf("Last(a) = %d, Last(b) = %d; want 2 and 0", a.Last("a"), a.Last("b"))
	}
	a.Requeued("b", 1)
	a.Requeued("c", 4) // over the bound: a or b goes
	if n := len(a.m); n != 2 || a.Last("c") != 4 {
		t.Errorf("%d keys kept, Last(c) = %d; want 2 and 4", n, a.Last("c"))
	}
	a.Forget("c")
	if a.Last("c") != 0 {
		t.Error("Forget left the key")
	}
}

func TestDelaysRunUntilStop(t *testing.T) {
	var d Delays
	var ran atomic.Int32
	done := make(chan struct{})
	if !d.After(time.Millisecond, func() { ran.Add(1); close(done) }) {
		t.Fatal("After refused before Stop")
	}
	<-done
	release := make(chan struct{})
	started := make(chan struct{})
	d.After(0, func() { close(started); <-release; ran.Add(1) })
	d.After(time.Hour, func() { ran.Add(100) })
	<-started
	stopped := make(chan struct{})
	go func() { d.Stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while a settlement ran")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	<-stopped
	if n := ran.Load(); n != 2 {
		t.Errorf("%d ran, want 2: the waiting one must be cancelled", n)
	}
	if d.After(0, func() { ran.Add(1000) }) {
		t.Error("After accepted a settlement after Stop")
	}
	time.Sleep(10 * time.Millisecond)
	if ran.Load() != 2 {
		t.Error("a settlement ran after Stop")
	}
}
