package brokertest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
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
		{"dead-letter-drops", "DeadLetterParksWithCause", "DeadLetterParksWithCause"},
		{"settles-after-close", "GracefulCloseWithDeliveriesInFlight", "GracefulCloseWithDeliveriesInFlight"},
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
					d, err := s.Receive(ctx)
					if err != nil {
						return brokertest.RawMessage{}, err
					}
					m := d.Message()
					return brokertest.RawMessage{ID: m.ID, Key: m.Key, Headers: m.Headers, Body: m.Body}, d.Ack(ctx)
				},
				Publish: func(ctx context.Context, msgs ...*driver.Message) error {
					return b.Publish(ctx, queue, msgs...)
				},
				NewSource: func(t *testing.T) driver.Source {
					s, err := b.Subscribe(queue)
					if err != nil {
						t.Fatal(err)
					}
					return &broken{Subscription: s, mode: mode}
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
	driver.RegisterBroker("brokenmem",
		func(_ context.Context, u *url.URL, _ driver.OpenConfig) (driver.Source, error) {
			b, q, err := open(u)
			if err != nil {
				return nil, err
			}
			return b.Subscribe(q)
		},
		func(_ context.Context, u *url.URL, _ driver.OpenConfig) (driver.Publisher, error) {
			b, q, err := open(u)
			if err != nil {
				return nil, err
			}
			return b.Publisher(q), nil
		})
}

// broken is a memory subscription with one deliberate defect.
type broken struct {
	*memory.Subscription
	mode string

	mu     sync.Mutex
	held   []*brokenDelivery // received and not settled, for batch-acks-everything
	closed bool
	again  *brokenDelivery // delivers-twice: the copy to hand out next
}

type brokenDelivery struct {
	driver.Delivery
	src  *broken
	msg  *driver.Message
	copy bool
}

func (b *broken) Receive(ctx context.Context) (driver.Delivery, error) {
	b.mu.Lock()
	if b.again != nil {
		d := b.again
		b.again = nil
		b.mu.Unlock()
		return d, nil
	}
	b.mu.Unlock()
	d, err := b.Subscription.Receive(ctx)
	if err != nil {
		return nil, err
	}
	m := *d.Message()
	if b.mode == "attempt-always-1" {
		m.Attempt = 1
	}
	bd := &brokenDelivery{Delivery: d, src: b, msg: &m}
	b.mu.Lock()
	b.held = append(b.held, bd)
	if b.mode == "delivers-twice" {
		c := *bd
		c.copy = true
		b.again = &c
	}
	b.mu.Unlock()
	return bd, nil
}

func (b *broken) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return b.Subscription.Close()
}

func (b *broken) forget(d *brokenDelivery) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, h := range b.held {
		if h == d {
			b.held = append(b.held[:i], b.held[i+1:]...)
			return
		}
	}
}

func (b *broken) AckBatch(ctx context.Context, ds []driver.Delivery) error {
	var inner []driver.Delivery
	if b.mode == "batch-acks-everything" {
		// Like a multiple ack up to the highest tag: everything held goes.
		b.mu.Lock()
		for _, h := range b.held {
			inner = append(inner, h.Delivery)
		}
		b.held = nil
		b.mu.Unlock()
	} else {
		for _, d := range ds {
			bd := d.(*brokenDelivery)
			b.forget(bd)
			inner = append(inner, bd.Delivery)
		}
	}
	return b.Subscription.AckBatch(ctx, inner)
}

func (d *brokenDelivery) Message() *driver.Message { return d.msg }

func (d *brokenDelivery) Ack(ctx context.Context) error {
	d.src.forget(d)
	switch {
	case d.copy:
		return nil // the copy of delivers-twice: its original settles
	case d.src.mode == "ack-is-a-lie":
		return nil
	case d.src.mode == "stale-ack-succeeds":
		if err := d.Delivery.Ack(ctx); !errors.Is(err, driver.ErrStaleDelivery) {
			return err
		}
		return nil // pretends a stale ack reached the broker
	case d.src.mode == "settles-after-close":
		d.src.mu.Lock()
		closed := d.src.closed
		d.src.mu.Unlock()
		if closed {
			return nil // pretends the ack of a returned message worked
		}
	}
	return d.Delivery.Ack(ctx)
}

func (d *brokenDelivery) DeadLetter(ctx context.Context, cause error) error {
	d.src.forget(d)
	if d.src.mode == "dead-letter-drops" {
		return d.Delivery.Ack(ctx) // silently dropped
	}
	return d.Delivery.DeadLetter(ctx, cause)
}

func (d *brokenDelivery) Retry(ctx context.Context, delay time.Duration) error {
	d.src.forget(d)
	return d.Delivery.Retry(ctx, delay)
}
