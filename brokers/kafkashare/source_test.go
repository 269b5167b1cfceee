package kafkashare

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// receive takes n deliveries from s within d.
func receive(t *testing.T, s *Source, n int, d time.Duration) []driver.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out []driver.Delivery
	for len(out) < n {
		del, err := s.Receive(ctx)
		if err != nil {
			t.Fatalf("Receive after %d of %d: %v", len(out), n, err)
		}
		out = append(out, del)
	}
	return out
}

// TestAcceptedOnce: accepted records never come back, to this member or
// another; attempts start at 1; ids come from the header.
func TestAcceptedOnce(t *testing.T) {
	bs := cluster(t, 5)
	topic := newTopic(t, bs, 2)
	var msgs []*driver.Message
	for i := range 20 {
		msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("m-%d", i), Key: fmt.Sprint(i % 3), Body: []byte("b")})
	}
	produce(t, bs, topic, msgs...)
	url := sourceURL(bs, topic, "g-"+randomHex(3), "")
	s := open(t, url)
	if s.RecordLock() != testLock {
		t.Errorf("RecordLock %v, want the cluster's %v", s.RecordLock(), testLock)
	}
	if n, ok := s.DeliveryLimit(context.Background()); !ok || n != 5 {
		t.Errorf("DeliveryLimit %d, %v; want 5", n, ok)
	}
	seen := map[string]bool{}
	for _, d := range receive(t, s, 20, 20*time.Second) {
		m := d.Message()
		if m.Attempt != 1 || m.System != "kafka" || m.Source != topic {
			t.Errorf("message %+v", m)
		}
		seen[m.ID] = true
		if err := d.Ack(context.Background()); err != nil {
			t.Errorf("Ack %s: %v", m.ID, err)
		}
	}
	if len(seen) != 20 {
		t.Fatalf("%d distinct ids, want 20", len(seen))
	}
	s.Close()
	s2 := open(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*testLock)
	defer cancel()
	if d, err := s2.Receive(ctx); err == nil {
		t.Fatalf("a record came back after it was accepted: %+v", d.Message())
	}
}
