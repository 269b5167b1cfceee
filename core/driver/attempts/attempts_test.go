package attempts

import (
	"testing"
)

func TestMemoRemembersUpToItsBound(t *testing.T) {
	a := New[string](2)
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
