package brokertest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"maps"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/brokers/memory"
)

// The suite must be able to fail. Each case runs the suite (the cases that
// should notice) in a child process on the memory broker behind an
// adapter broken in one way, and expects the named subtest to fail.
func TestSuiteCatchesBrokenAdapters(t *testing.T) {
	if os.Getenv("BROKERTEST_BROKEN") != "" {
		t.Skip("inside a child run")
	}
	catchesDefects(t, "BROKERTEST_BROKEN", "TestBrokenAdapter", []brokenCase{
		{"ack-is-a-lie", "AckRemoves", "AckRemoves"},
		{"batch-acks-everything", "AckBatchAcksExactlyTheBatch", "AckBatchAcksExactlyTheBatch"},
		{"attempt-always-1", "RetryRedeliversWithHigherAttempt", "RetryRedeliversWithHigherAttempt"},
		{"retry-drops", "RetryRedeliversWithHigherAttempt", "RetryRedeliversWithHigherAttempt"},
		{"dead-letter-drops", "DeadLetterParksWithCause", "DeadLetterParksWithCause"},
		{"release-drops", "GracefulCloseWithDeliveriesInFlight", "GracefulCloseWithDeliveriesInFlight"},
		{"release-drops", "UnackedComeBackAfterConsumerDies", "UnackedComeBackAfterConsumerDies"},
		{"delivers-twice", "Pipeline/DuplicatesApplyOnce", "Pipeline/DuplicatesApplyOnce"},
		{"stale-ack-succeeds", "SettleAfterReconnectIsStale", "SettleAfterReconnectIsStale"},
		{"publisher-drops-trace-context", "PublisherRoundTrip", "PublisherRoundTrip"},
		{"url-ignores-unknown-parameters", "URLRefusesUnknownParameter", "URLRefusesUnknownParameter"},
	})
}

// TestBrokenAdapter is the child run of TestSuiteCatchesBrokenAdapters.
func TestBrokenAdapter(t *testing.T) {
	mode := os.Getenv("BROKERTEST_BROKEN")
	if mode == "" {
		t.Skip("run as a child of TestSuiteCatchesBrokenAdapters")
	}
	// A named broker, so that mem:// URLs reach it too.
	b, err := memory.Named("broken", memory.WithVisibilityTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	brokertest.Run(t, brokertest.Harness{
		RecordsCause:   true,
		CarriesKey:     true,
		Quiet:          100 * time.Millisecond,
		ReceiveTimeout: 3 * time.Second,
		Open: func(t *testing.T) *brokertest.Fixture {
			var r [4]byte
			_, _ = rand.Read(r[:])
			queue := "broken-" + hex.EncodeToString(r[:])
			url := "mem://" + queue + "?broker=broken"
			if mode == "url-ignores-unknown-parameters" {
				url = "brokenmem://" + queue
			}
			return &brokertest.Fixture{
				SourceURL:    url,
				PublisherURL: url,
				NewPublisher: func(t *testing.T) driver.Publisher {
					p := b.Publisher(queue)
					if mode == "publisher-drops-trace-context" {
						return untracedPublisher{p}
					}
					return p
				},
				Reconnect: func(t *testing.T, src driver.Source) { src.(*broken).ExpireLeases() },
				Raw: func(ctx context.Context) (brokertest.RawMessage, error) {
					s, err := b.Subscribe(queue)
					if err != nil {
						return brokertest.RawMessage{}, err
					}
					defer s.Close()
					ms, err := s.Receive(ctx, 1)
					if err != nil {
						return brokertest.RawMessage{}, err
					}
					m := ms[0]
					return brokertest.RawMessage{ID: m.ID, Key: m.Key, Headers: m.Headers, Body: m.Body}, s.Ack(ctx, ms)
				},
				Publish: func(ctx context.Context, msgs ...*driver.Message) error {
					return b.Publish(ctx, queue, msgs...)
				},
				NewSource: func(t *testing.T) driver.Source {
					s, err := b.Subscribe(queue)
					if err != nil {
						t.Fatal(err)
					}
					return &broken{Subscription: s, mode: mode, held: map[*driver.Message]bool{}}
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					var out []brokertest.DeadLetter
					for _, dl := range b.DeadLetters(queue) {
						out = append(out, brokertest.DeadLetter{ID: dl.Message.ID, Body: dl.Message.Body, Cause: dl.Cause.Error()})
					}
					return out, nil
				},
			}
		},
	})
}

// untracedPublisher forgets the caller's context, and with it the trace
// context a publisher must carry.
type untracedPublisher struct{ driver.Publisher }

func (p untracedPublisher) Publish(_ context.Context, dest string, msgs ...*driver.Message) error {
	return p.Publisher.Publish(context.Background(), dest, msgs...)
}

// brokenmem:// opens the broken adapter's queues on the "broken" memory
// broker and ignores every URL parameter, as a careless opener does.
func init() {
	open := func(u *url.URL) (*memory.Broker, string, error) {
		b, err := memory.Named("broken")
		return b, strings.Trim(u.Host+u.Path, "/"), err
	}
	driver.RegisterSource("brokenmem", func(_ context.Context, u *url.URL, _ driver.OpenConfig) (driver.Source, error) {
		b, q, err := open(u)
		if err != nil {
			return nil, err
		}
		return b.Subscribe(q)
	})
	driver.RegisterPublisher("brokenmem", func(_ context.Context, u *url.URL, _ driver.OpenConfig) (driver.Publisher, error) {
		b, q, err := open(u)
		if err != nil {
			return nil, err
		}
		return b.Publisher(q), nil
	})
}

// broken is a memory subscription with one deliberate defect, in what it
// receives or in one of its settlement calls.
type broken struct {
	*memory.Subscription
	mode string

	mu    sync.Mutex
	held  map[*driver.Message]bool // received and not settled, for batch-acks-everything
	again []*driver.Message        // delivers-twice: the copies to hand out next
}

func (b *broken) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	b.mu.Lock()
	if n := min(max, len(b.again)); n > 0 {
		ms := b.again[:n:n]
		b.again = b.again[n:]
		b.mu.Unlock()
		return ms, nil
	}
	b.mu.Unlock()
	ms, err := b.Subscription.Receive(ctx, max)
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range ms {
		switch b.mode {
		case "attempt-always-1":
			m.Attempt = 1
		case "delivers-twice":
			c := *m // the same delivery handed out again
			b.again = append(b.again, &c)
		}
		b.held[m] = true
	}
	return ms, err
}

// settled forgets ms as held.
func (b *broken) settled(ms []*driver.Message) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range ms {
		delete(b.held, m)
	}
}

func (b *broken) Ack(ctx context.Context, ms []*driver.Message) error {
	switch b.mode {
	case "batch-acks-everything":
		// Like a multiple ack up to the highest tag: everything held goes.
		b.mu.Lock()
		all := slices.Collect(maps.Keys(b.held))
		clear(b.held)
		b.mu.Unlock()
		_ = b.Subscription.Ack(ctx, all)
		return nil
	case "ack-is-a-lie":
		b.settled(ms)
		return nil
	case "stale-ack-succeeds":
		b.settled(ms)
		if err := b.Subscription.Ack(ctx, ms); !errors.Is(err, driver.ErrStaleDelivery) {
			return err
		}
		return nil // pretends a stale ack reached the broker
	}
	b.settled(ms)
	return b.Subscription.Ack(ctx, ms)
}

func (b *broken) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	b.settled(ms)
	if b.mode == "retry-drops" {
		return b.Subscription.Ack(ctx, ms) // never redelivered
	}
	return b.Subscription.Retry(ctx, ms, delay)
}

func (b *broken) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	b.settled(ms)
	if b.mode == "dead-letter-drops" {
		return b.Subscription.Ack(ctx, ms) // silently dropped
	}
	return b.Subscription.DeadLetter(ctx, ms, causes)
}

func (b *broken) Release(ctx context.Context, ms []*driver.Message) error {
	b.settled(ms)
	if b.mode == "release-drops" {
		return b.Subscription.Ack(ctx, ms) // given back to nobody
	}
	return b.Subscription.Release(ctx, ms)
}
