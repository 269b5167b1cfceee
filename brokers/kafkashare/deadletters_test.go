package kafkashare

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
)

// admin.OpenDeadLetters takes the kafka+share:// URL: it lists what the
// Source parked, with the cause; a redrive puts the copies back on the
// topic, and the share group receives them again (settled one at a time:
// the Source takes more only once its poll is settled).
func TestDeadLettersOperated(t *testing.T) {
	bs := cluster(t, 5)
	topic := newTopic(t, bs, 1)
	url := sourceURL(bs, topic, "g-"+randomHex(3), "")
	produce(t, bs, topic, &driver.Message{ID: "p-1", Body: []byte("one")}, &driver.Message{ID: "p-2", Body: []byte("two")})
	s := open(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 2 {
		d := receive(t, s, 1, 20*time.Second)[0]
		if err := d.DeadLetter(ctx, errors.New("card declined")); err != nil {
			t.Fatalf("DeadLetter %s: %v", d.Message().ID, err)
		}
	}
	q, err := admin.OpenDeadLetters(ctx, url)
	if err != nil {
		t.Fatalf("admin.OpenDeadLetters: %v", err)
	}
	defer q.Close()
	parked := map[string]string{}
	for deadline := time.Now().Add(10 * time.Second); len(parked) < 2 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_ = q.Scan(ctx, func(p *admin.Parked) error { parked[p.ID] = p.Cause; return nil })
	}
	if len(parked) != 2 || parked["p-1"] != "card declined" || parked["p-2"] != "card declined" {
		t.Fatalf("parked %v, want p-1 and p-2 with their cause", parked)
	}
	if n, err := q.Redrive(ctx, nil, nil); err != nil || n != 2 {
		t.Fatalf("Redrive = %d, %v; want 2", n, err)
	}
	back := map[string]bool{}
	for range 2 {
		d := receive(t, s, 1, 20*time.Second)[0]
		back[d.Message().ID] = true
		if err := d.Ack(ctx); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	}
	if !back["p-1"] || !back["p-2"] {
		t.Errorf("after the redrive: %v, want p-1 and p-2", back)
	}
	expectNone(t, s, testLock)
}
