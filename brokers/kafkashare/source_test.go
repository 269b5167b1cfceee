package kafkashare

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/sqlite"
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

// slowMessage publishes one record to a fresh topic and returns a Source
// of a fresh group (opened with opts) holding its first delivery.
func slowMessage(t *testing.T, opts ...Option) (*Source, driver.Delivery, string) {
	t.Helper()
	bs := cluster(t, 5)
	topic := newTopic(t, bs, 1)
	produce(t, bs, topic, &driver.Message{ID: "slow", Body: []byte("b")})
	url := sourceURL(bs, topic, "g-"+randomHex(3), "")
	s := open(t, url, opts...)
	return s, receive(t, s, 1, 20*time.Second)[0], url
}

// A handler outliving the lock without renewal (max_extension passed):
// the broker delivers the record again; the first
// delivery's late Ack is stale, the copy's goes through, and nothing
// comes back after.
func TestLockLapsesWithoutRenewal(t *testing.T) {
	s, first, _ := slowMessage(t, WithMaxExtension(time.Millisecond))
	time.Sleep(testLock + testLock/2)
	again := receive(t, s, 1, 20*time.Second)[0]
	// 2, or 3 when the member had fetched the copy before it released
	// the lapsed delivery.
	if m := again.Message(); m.ID != "slow" || m.Attempt < 2 {
		t.Fatalf("after the lapse: %s attempt %d, want slow attempt 2 or more", m.ID, m.Attempt)
	}
	if err := first.Ack(context.Background()); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Errorf("late Ack of the first delivery: %v, want a stale error", err)
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Fatalf("Ack of the copy: %v", err)
	}
	expectNone(t, s, 2*testLock)
}

// With renewal (the default), the record stays with its member while the
// handler takes three locks' time: no other member gets a copy, and the
// Ack goes through.
func TestLockRenewedForSlowHandler(t *testing.T) {
	s, first, url := slowMessage(t)
	other := open(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 3*testLock)
	defer cancel()
	if d, err := other.Receive(ctx); err == nil {
		t.Fatalf("another member got %s (attempt %d) while the first renewed its lock", d.Message().ID, d.Message().Attempt)
	}
	if err := first.Ack(context.Background()); err != nil {
		t.Fatalf("Ack after three locks' time: %v", err)
	}
	other.Close()
	expectNone(t, s, 2*testLock)
}

// expectNone checks s receives nothing within d.
func expectNone(t *testing.T, s *Source, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if del, err := s.Receive(ctx); err == nil {
		t.Fatalf("received %s (attempt %d), want nothing", del.Message().ID, del.Message().Attempt)
	}
}

// The Consumer checks its MaxAttempts against the group's delivery-count
// limit: above it, Run warns naming the share group's config, or refuses
// under WithStrictDeliveryLimit.
func TestDeliveryLimitChecked(t *testing.T) {
	bs := cluster(t, 3)
	topic := newTopic(t, bs, 1)
	url := sourceURL(bs, topic, "g-"+randomHex(3), "")
	store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "dedup.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	handler := func(context.Context, *sql.Tx, *core.Message) error { return nil }
	for _, strict := range []bool{false, true} {
		logs := &strings.Builder{}
		var mu sync.Mutex
		opts := []core.Option{core.WithName("share-test"), core.WithMaxAttempts(5), core.WithLogger(slog.New(slog.NewTextHandler(logWriter{&mu, logs}, nil)))}
		if strict {
			opts = append(opts, core.WithStrictDeliveryLimit())
		}
		c, err := core.New[*sql.Tx](open(t, url), store, handler, opts...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = c.Run(ctx)
		cancel()
		mu.Lock()
		out := logs.String()
		mu.Unlock()
		if strict {
			if err == nil || !strings.Contains(err.Error(), "share.delivery.count.limit=5") || !strings.Contains(err.Error(), "3") {
				t.Errorf("strict: Run returned %v, want a refusal naming the limit 3 and the group config to raise", err)
			}
			continue
		}
		if err != nil || !strings.Contains(out, "delivery_limit=3") || !strings.Contains(out, "max_attempts=5") {
			t.Errorf("Run: %v; log %q, want a warning naming delivery_limit=3 and max_attempts=5", err, out)
		}
	}
}

// logWriter serialises writes to w.
type logWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l logWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
