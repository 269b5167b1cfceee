package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
)

// dlqModes are the two ways a message reaches the dead-letter queue: the
// Source republishes it (classic queues), or the broker dead-letters what
// the Source rejects (quorum queues).
var dlqModes = []struct {
	name string
	opts []Option
}{
	{"ClassicRepublish", []Option{WithQueueType(Classic), WithDeadLetterMode(DeadLetterRepublish)}},
	{"QuorumReject", []Option{WithQueueType(Quorum), WithDeadLetterMode(DeadLetterReject)}},
}

// parkN publishes n messages (ids prefix-000, …) to a fresh queue of a
// Source opened with opts, dead-letters each and waits until all are
// parked. It returns the URL, the
// queue, the Receiver over the Source and the ids.
func parkN(t *testing.T, n int, prefix string, opts ...Option) (string, string, *brokertest.Receiver, []string) {
	t.Helper()
	url, queue, src, r := openTestSource(t, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, err := NewPublisher(ctx, url, WithRoutingKey(queue))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ids := make([]string, n)
	msgs := make([]*driver.Message, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		msgs[i] = &driver.Message{ID: ids[i], Body: []byte("body of " + ids[i]), Key: "k" + ids[i], Headers: map[string]string{"h": ids[i]}}
	}
	if err := pub.Publish(ctx, "", msgs...); err != nil {
		t.Fatal(err)
	}
	for range n {
		d := receiveN(t, r, 1, 10*time.Second)[0]
		if err := d.DeadLetter(ctx, errors.New("bad deploy "+d.Message().ID)); err != nil {
			t.Fatal(err)
		}
	}
	// The broker dead-letters rejected messages after the reject.
	waitUntil(t, 10*time.Second, func() bool { return queueDepth(t, url, src.cfg.deadLetterQueue) == n })
	return url, queue, r, ids
}

// openDLQ opens the dead-letter queue of queue, closed when the test ends.
func openDLQ(t *testing.T, url, queue string, opts ...Option) *DeadLetters {
	t.Helper()
	q, err := OpenDeadLetters(context.Background(), url, append([]Option{WithQueue(queue)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// scanAll returns every parked message, in the order Scan gave them.
func scanAll(t *testing.T, q *DeadLetters) []*admin.Parked {
	t.Helper()
	var out []*admin.Parked
	if err := q.Scan(context.Background(), func(p *admin.Parked) error { out = append(out, p); return nil }); err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return out
}

// parkedIDs returns the sorted ids of ps.
func parkedIDs(ps []*admin.Parked) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.ID
	}
	slices.Sort(out)
	return out
}

// A dead-letter queue larger than anything fetched at once: 250 parked, 100
// chosen by id are redriven and come back exactly once as first attempts,
// the 150 others stay parked with the Refs they had, and Purge deletes them.
func TestDeadLettersRedriveChosenOfMany(t *testing.T) {
	for _, mode := range dlqModes {
		t.Run(mode.name, func(t *testing.T) {
			url, queue, src, ids := parkN(t, 250, "many", mode.opts...)
			q := openDLQ(t, url, queue, mode.opts...)
			if q.Name() != queue+".dlq" {
				t.Errorf("Name() = %q, want %q", q.Name(), queue+".dlq")
			}
			before := scanAll(t, q)
			if got := parkedIDs(before); !slices.Equal(got, ids) {
				t.Fatalf("Scan listed %d messages, want the 250 parked", len(got))
			}
			refs := map[string]string{}
			for _, p := range before {
				if _, dup := refs[p.Ref]; dup {
					t.Fatalf("Ref %q given twice", p.Ref)
				}
				refs[p.Ref] = p.ID
				if p.Origin != queue || p.Destination != queue {
					t.Errorf("%s: Origin %q Destination %q, want %q", p.ID, p.Origin, p.Destination, queue)
				}
				if p.Key != "k"+p.ID || p.Headers["h"] != p.ID || string(p.Body) != "body of "+p.ID {
					t.Errorf("%s: Key %q, header h %q, Body %q", p.ID, p.Key, p.Headers["h"], p.Body)
				}
			}
			if n := queueDepth(t, url, q.Name()); n != 250 {
				t.Errorf("after Scan the dead-letter queue holds %d ready messages, want 250", n)
			}

			chosen := map[string]bool{}
			for i := 0; i < 250; i += 5 {
				chosen[ids[i]], chosen[ids[i+1]] = true, true
			}
			calls := 0
			n, err := q.Redrive(context.Background(), func(p *admin.Parked) bool { calls++; return chosen[p.ID] }, nil)
			if err != nil || n != 100 {
				t.Fatalf("Redrive = %d, %v; want 100, nil", n, err)
			}
			if calls != 250 {
				t.Errorf("Redrive called sel %d times, want 250", calls)
			}
			back := map[string]int{}
			for _, d := range receiveN(t, src, 100, 20*time.Second) {
				m := d.Message()
				back[m.ID]++
				if m.Attempt != 1 {
					t.Errorf("redriven %s: Attempt %d, want 1", m.ID, m.Attempt)
				}
				for k := range m.Headers {
					if slices.Contains([]string{driver.CauseHeader, driver.AttemptHeader, driver.OriginHeader, driver.ParkedAtHeader, driver.DestinationHeader}, k) ||
						k == "x-death" || strings.HasPrefix(k, "x-idemq-") || strings.HasPrefix(k, "x-first-death") {
						t.Errorf("redriven %s still carries %s", m.ID, k)
					}
				}
				if m.Key != "k"+m.ID || m.Headers["h"] != m.ID || string(m.Body) != "body of "+m.ID {
					t.Errorf("redriven %s: Key %q, header h %q, Body %q", m.ID, m.Key, m.Headers["h"], m.Body)
				}
				if err := d.Ack(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if !maps.Equal(back, func() map[string]int {
				want := map[string]int{}
				for id := range chosen {
					want[id] = 1
				}
				return want
			}()) {
				t.Errorf("redriven messages came back %v, want each chosen one once", back)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			if d, err := src.Receive(ctx); err == nil {
				t.Errorf("unexpected delivery %s after the redriven ones", d.Message().ID)
			}

			after := scanAll(t, q)
			if len(after) != 150 {
				t.Fatalf("after Redrive %d parked, want 150", len(after))
			}
			for _, p := range after {
				if chosen[p.ID] {
					t.Errorf("%s was redriven but is still parked", p.ID)
				}
				if refs[p.Ref] != p.ID {
					t.Errorf("%s: Ref %q changed (first scan had it for %q)", p.ID, p.Ref, refs[p.Ref])
				}
			}

			n, err = q.Purge(context.Background(), func(*admin.Parked) bool { return true })
			if err != nil || n != 150 {
				t.Fatalf("Purge = %d, %v; want 150, nil", n, err)
			}
			if left := scanAll(t, q); len(left) != 0 {
				t.Errorf("after Purge %d still parked", len(left))
			}
		})
	}
}

// What Scan reports of a copy the Source republished, and of one the
// broker dead-lettered itself.
func TestDeadLettersScanFields(t *testing.T) {
	for _, mode := range dlqModes {
		t.Run(mode.name, func(t *testing.T) {
			begin := time.Now()
			url, queue, _, _ := parkN(t, 1, "fields", mode.opts...)
			q := openDLQ(t, url, queue, mode.opts...)
			ps := scanAll(t, q)
			if len(ps) != 1 {
				t.Fatalf("Scan listed %d, want 1", len(ps))
			}
			p := ps[0]
			if p.ParkedAt.Before(begin.Truncate(time.Second)) || p.ParkedAt.After(time.Now()) {
				t.Errorf("ParkedAt %v, want between %v and now", p.ParkedAt, begin)
			}
			if p.Headers[driver.CauseHeader] != "" {
				if p.Cause != "bad deploy fields-000" || p.Attempt != 1 || p.Headers[driver.ParkedAtHeader] == "" {
					t.Errorf("republished copy: Cause %q, Attempt %d, %s %q", p.Cause, p.Attempt, driver.ParkedAtHeader, p.Headers[driver.ParkedAtHeader])
				}
				if d := p.ParkedAt.Sub(begin); d < 0 || d > 10*time.Second {
					t.Errorf("ParkedAt %v is %v after the start: want millisecond precision", p.ParkedAt, d)
				}
			} else {
				want := fmt.Sprintf(`rejected by the consumer (its log has the cause): x-death reason "rejected" from queue %q`, queue)
				if !strings.Contains(p.Cause, want) || p.Attempt != 0 {
					t.Errorf("broker-parked copy: Cause %q (want it to hold %q), Attempt %d (want 0: unknown)", p.Cause, want, p.Attempt)
				}
			}
		})
	}
}

// A Redrive whose destination queue is gone fails on the first chosen
// message and leaves every message parked.
func TestDeadLettersRedriveUnroutable(t *testing.T) {
	url, queue, src, ids := parkN(t, 3, "gone")
	q := openDLQ(t, url, queue)
	src.Close()
	ch := testChannel(t, url)
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	n, err := q.Redrive(context.Background(), func(*admin.Parked) bool { return true }, nil)
	if n != 0 || err == nil || !strings.Contains(err.Error(), "unroutable") {
		t.Fatalf("Redrive = %d, %v; want 0 and an unroutable error", n, err)
	}
	if got := parkedIDs(scanAll(t, q)); !slices.Equal(got, ids) {
		t.Errorf("after the failed Redrive parked %v, want %v", got, ids)
	}
}

// Scan, Redrive and Purge handle what was parked when they began and
// terminate while messages keep arriving.
func TestDeadLettersBoundedWhileParking(t *testing.T) {
	url, queue, _, _ := parkN(t, 20, "bounded")
	q := openDLQ(t, url, queue)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // a producer that keeps parking
		defer wg.Done()
		ch, done := dialChannel(t, url)
		defer done()
		for i := 0; ctx.Err() == nil; i++ {
			_ = ch.PublishWithContext(ctx, "", q.Name(), false, false, amqp.Publishing{MessageId: fmt.Sprintf("late-%d", i)})
			time.Sleep(time.Millisecond)
		}
	}()
	defer wg.Wait()
	defer cancel()
	time.Sleep(50 * time.Millisecond)
	seen := 0
	if err := q.Scan(context.Background(), func(*admin.Parked) error { seen++; return nil }); err != nil || seen < 20 {
		t.Fatalf("Scan saw %d, %v; want at least 20, nil", seen, err)
	}
	calls := 0
	n, err := q.Purge(context.Background(), func(p *admin.Parked) bool { calls++; return strings.HasPrefix(p.ID, "bounded-") })
	if err != nil || n != 20 || calls < 20 {
		t.Fatalf("Purge = %d, %v after %d calls; want 20, nil", n, err, calls)
	}
}

// The dead-letter queue opens from the Source's URL, nodes list and
// parameters included, and refuses what the Source refuses.
func TestDeadLettersOpenByURL(t *testing.T) {
	dlq := fmt.Sprintf("idemq-test-custom-dlq-%d", time.Now().UnixNano())
	url, queue, _, ids := parkN(t, 2, "byurl", WithDeadLetterQueue(dlq))
	t.Cleanup(func() {
		ch, done := dialChannel(t, url)
		defer done()
		_, _ = ch.QueueDelete(dlq, false, false, false)
	})
	hp, _ := parseAMQP(url)
	if !strings.Contains(url, hp) {
		t.Skip("IDEMQ_AMQP_URL names no port")
	}
	// A cluster's node list, one node of which is down.
	nodesURL := strings.Replace(strings.TrimSuffix(url, "/"), hp, "127.0.0.1:1,"+hp, 1)
	raw := nodesURL + "/?queue=" + queue + "&dead_letter_queue=" + dlq
	q, err := admin.OpenDeadLetters(context.Background(), raw)
	if err != nil {
		t.Fatalf("admin.OpenDeadLetters: %v", err)
	}
	defer q.Close()
	if q.Name() != dlq {
		t.Errorf("Name() = %q", q.Name())
	}
	var got []string
	if err := q.Scan(context.Background(), func(p *admin.Parked) error { got = append(got, p.ID); return nil }); err != nil {
		t.Fatal(err)
	}
	if slices.Sort(got); !slices.Equal(got, ids) {
		t.Errorf("Scan by URL listed %v, want %v", got, ids)
	}
	if _, err := admin.OpenDeadLetters(context.Background(), raw+"&bogus_param=1"); err == nil || !strings.Contains(err.Error(), "bogus_param") {
		t.Errorf("unknown parameter: err %v, want one naming bogus_param", err)
	}
	if _, err := admin.OpenDeadLetters(context.Background(), strings.TrimSuffix(url, "/")+"/?queue="+queue+"&dead_letter_queue=idemq-no-such-dlq"); err == nil {
		t.Error("a dead-letter queue that does not exist opened")
	}
}

// Every call returns the messages it keeps to the queue, which a quorum
// queue counts as a delivery: the dead-letter queue the Source declares
// has no delivery limit (even when the consumer's queue has one), so
// scanning often loses nothing.
func TestDeadLettersQuorumScansLoseNothing(t *testing.T) {
	opts := []Option{WithQueueType(Quorum), WithDeliveryLimit(2)}
	url, queue, _, ids := parkN(t, 3, "often", opts...)
	q := openDLQ(t, url, queue, opts...)
	for i := range 6 {
		if got := parkedIDs(scanAll(t, q)); !slices.Equal(got, ids) {
			t.Fatalf("scan %d listed %v, want %v", i+1, got, ids)
		}
	}
}
