package core

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
)

type nopSource struct{}

func (nopSource) Start(context.Context, driver.Setup) (driver.Traits, error) {
	return driver.Traits{}, nil
}
func (nopSource) Receive(ctx context.Context, _ int) ([]*driver.Message, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (nopSource) Ack(context.Context, []*driver.Message) error                  { return nil }
func (nopSource) Retry(context.Context, []*driver.Message, time.Duration) error { return nil }
func (nopSource) DeadLetter(context.Context, []*driver.Message, []error) error  { return nil }
func (nopSource) Close() error                                                  { return nil }

type nopStore struct{}

func (nopStore) Begin(context.Context) (driver.Txn[struct{}], error) { return nil, ErrShutdown }
func (nopStore) Close() error                                        { return nil }
func (nopStore) As(any) bool                                         { return false }

func TestNewRejectsBadOptionsNamingThem(t *testing.T) {
	h := func(context.Context, struct{}, *Message) error { return nil }
	cases := []struct {
		opts []Option
		want string
	}{
		{nil, "WithName is required"},
		{[]Option{WithName("")}, "WithName"},
		{[]Option{WithName("bad\x00name")}, "WithName"},
		{[]Option{WithName(strings.Repeat("n", 201))}, "WithName"},
		{[]Option{WithName("c"), WithConcurrency(0)}, "WithConcurrency"},
		{[]Option{WithName("c"), WithBatchSize(0)}, "WithBatchSize"},
		{[]Option{WithName("c"), WithBatchSize(100), WithWindow(10)}, "WithWindow"},
		{[]Option{WithName("c"), WithWindow(0)}, "WithWindow"},
		{[]Option{WithName("c"), WithLinger(-time.Second)}, "WithLinger"},
		{[]Option{WithName("c"), WithMaxAttempts(0)}, "WithMaxAttempts"},
		{[]Option{WithName("c"), WithBackoff(nil)}, "WithBackoff"},
		{[]Option{WithName("c"), WithIDFunc(nil)}, "WithIDFunc"},
		{[]Option{WithName("c"), WithLimits(Limits{IDBytes: 5000})}, "WithLimits"},
		{[]Option{WithName("c"), WithLimits(Limits{BodyBytes: -1})}, "WithLimits"},
		{[]Option{WithName("c"), WithShutdownTimeout(0)}, "WithShutdownTimeout"},
		{[]Option{WithName("c"), WithLogger(nil)}, "WithLogger"},
		{[]Option{WithName("c"), WithObserver(nil)}, "WithObserver"},
		{[]Option{WithName("c"), WithHandlerMiddleware(nil)}, "WithHandlerMiddleware"},
		{[]Option{WithName("c"), WithMismatchDecision(Retry)}, "WithMismatchDecision"},
	}
	for _, tc := range cases {
		_, err := New[struct{}](nopSource{}, nopStore{}, h, tc.opts...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%d options) error = %v, want one naming %s", len(tc.opts), err, tc.want)
		}
	}
	if _, err := New[struct{}](nopSource{}, nopStore{}, h, WithName("ok"), WithBatchSize(100)); err != nil {
		t.Fatalf("valid options rejected: %v", err)
	}
	if _, err := New[struct{}](nil, nopStore{}, h, WithName("ok")); err == nil {
		t.Error("nil source accepted")
	}
}

func TestExponentialBackoff(t *testing.T) {
	b := ExponentialBackoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000} // milliseconds, capped at Max
	for i, w := range want {
		if got := b.Delay(i + 1); got != w*time.Millisecond {
			t.Errorf("Delay(%d) = %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	j := ExponentialBackoff{Initial: time.Second, Max: time.Minute, Multiplier: 2, Jitter: 0.2}
	for range 100 {
		if d := j.Delay(1); d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Fatalf("jittered delay %v outside ±20%% of 1s", d)
		}
	}
}

func TestValidateID(t *testing.T) {
	c := &Consumer[struct{}]{cfg: defaultConfig()}
	for _, bad := range []string{"", "a\x00b", string([]byte{0xff, 0xfe}), strings.Repeat("x", 256)} {
		if c.validateID(bad) == nil {
			t.Errorf("id %q accepted", shortID(bad))
		}
	}
	for _, good := range []string{"pay-1", "'; DROP TABLE x; --", "ünïcødé", strings.Repeat("x", 255)} {
		if err := c.validateID(good); err != nil {
			t.Errorf("id %q rejected: %v", good, err)
		}
	}
}

func TestExponentialBackoffMaxCapsJitterToo(t *testing.T) {
	b := ExponentialBackoff{Initial: time.Second, Max: 2 * time.Second, Multiplier: 2, Jitter: 0.2}
	for range 2000 {
		if d := b.Delay(10); d > 2*time.Second {
			t.Fatalf("Delay(10) = %v, above Max 2s", d)
		}
	}
}
