package rabbitmq

import (
	"math/rand/v2"
	"testing"
)

// TestLowestLiveTag: the session's lowest live tag, which decides how far
// a multiple ack may reach, matches a scan of the live tags through random
// deliveries (now and then one out of order) and settlements, with one
// delivery held for the middle of the run so that settled tags pile up
// behind it; and what the session keeps of settled tags stays bounded.
func TestLowestLiveTag(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, 11))
	s := &session{live: map[uint64]struct{}{}}
	want := func() uint64 {
		var low uint64
		for tag := range s.live {
			if low == 0 || tag < low {
				low = tag
			}
		}
		return low
	}
	var next uint64 = 1
	var skipped []uint64 // tags to deliver late, out of order
	held := uint64(0)
	for i := range 20000 {
		switch r := rnd.IntN(10); {
		case r < 5:
			if rnd.IntN(50) == 0 {
				skipped = append(skipped, next)
			} else {
				s.add(next)
				if held == 0 && i >= 4000 {
					held = next
				}
			}
			next++
		case r < 6 && len(skipped) > 0:
			s.add(skipped[0])
			skipped = skipped[1:]
		default:
			for tag := range s.live { // a random live one, never the held one until the end
				if tag != held || i > 12000 {
					delete(s.live, tag)
				}
				break
			}
		}
		s.mu.Lock()
		got := s.lowest()
		s.mu.Unlock()
		if w := want(); got != w {
			t.Fatalf("op %d: lowest %d, want %d (live %d)", i, got, w, len(s.live))
		}
		if len(s.order) > 2*len(s.live)+64 {
			t.Fatalf("op %d: %d tags kept for %d live", i, len(s.order), len(s.live))
		}
	}
	if held == 0 {
		t.Fatal("no delivery was held")
	}
}
