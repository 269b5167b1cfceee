package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core/driver"
)

func TestPrepare(t *testing.T) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("t").Start(context.Background(), "write")
	defer span.End()

	orig := map[string]string{"type": "created"}
	m := &Message{Destination: "orders", Headers: orig}
	h, err := Prepare(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if u, err := uuid.Parse(m.ID); err != nil || u.Version() != 7 {
		t.Fatalf("id %q is not a UUIDv7", m.ID)
	}
	if h["type"] != "created" || !strings.Contains(h["traceparent"], span.SpanContext().TraceID().String()) {
		t.Fatalf("headers %v lack the caller's header or trace", h)
	}
	if len(orig) != 1 {
		t.Fatal("Prepare changed the caller's headers")
	}
	given := &Message{ID: "mine", Destination: "orders"}
	if _, err := Prepare(context.Background(), given); err != nil || given.ID != "mine" {
		t.Fatalf("given id replaced: %q, %v", given.ID, err)
	}
	for _, bad := range []*Message{nil, {}, {Destination: strings.Repeat("d", 256)}, {Destination: "d", Key: strings.Repeat("k", 256)}} {
		if _, err := Prepare(context.Background(), bad); err == nil {
			t.Errorf("Prepare(%+v) accepted", bad)
		}
	}
}

// Destinations routes each destination to its own publisher (here the
// memory broker's, as core.OpenPublisher("mem://…") returns) and refuses
// unknown ones.
func TestDestinations(t *testing.T) {
	b, _ := memory.NewBroker()
	defer b.Close()
	p := Destinations(map[string]driver.Publisher{"orders": b.Publisher("q-orders"), "mail": b.Publisher("q-mail")})
	ctx := context.Background()
	if err := p.Publish(ctx, "orders", &driver.Message{ID: "1"}, &driver.Message{ID: "2"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(ctx, "mail", &driver.Message{ID: "3"}); err != nil {
		t.Fatal(err)
	}
	if b.Len("q-orders") != 2 || b.Len("q-mail") != 1 {
		t.Fatalf("queues hold %d and %d", b.Len("q-orders"), b.Len("q-mail"))
	}
	if err := p.Publish(ctx, "billing", &driver.Message{ID: "4"}); err == nil || !strings.Contains(err.Error(), `"billing"`) {
		t.Fatalf("unknown destination: %v", err)
	}
}

func TestByDestinationKeepsOrder(t *testing.T) {
	rows := []*Row{{Seq: 1, Destination: "a"}, {Seq: 2, Destination: "b"}, {Seq: 3, Destination: "a"}, {Seq: 4, Destination: "b"}, {Seq: 5, Destination: "c"}}
	g := byDestination(rows)
	if len(g) != 3 || g[0].dest != "a" || g[0].rows[0].Seq != 1 || g[0].rows[1].Seq != 3 || g[1].rows[1].Seq != 4 || g[2].rows[0].Seq != 5 {
		t.Fatalf("groups %+v", g)
	}
}

func TestOptions(t *testing.T) {
	c, err := buildConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.batch != DefaultBatchSize || c.window != DefaultBatchSize*DefaultWindowFactor || c.retention != DefaultRetention || !c.notify || c.publishTimeout != DefaultPublishTimeout ||
		c.maxAttempts != DefaultMaxAttempts || c.parked != HoldKey {
		t.Fatalf("defaults %+v", c)
	}
	for name, o := range map[string]Option{
		"WithBatchSize":      WithBatchSize(0),
		"WithWindow":         WithWindow(-1),
		"WithPollInterval":   WithPollInterval(0),
		"WithRetention":      WithRetention(-time.Second),
		"WithPruneInterval":  WithPruneInterval(time.Second, 0),
		"WithMaxBackoff":     WithMaxBackoff(0),
		"WithRetryBackoff":   WithRetryBackoff(time.Second, time.Millisecond),
		"WithPublishTimeout": WithPublishTimeout(0),
		"WithLogger":         WithLogger(nil),
		"WithMeterProvider":  WithMeterProvider(nil),
		"WithName":           WithName(""),
		"WithMaxAttempts":    WithMaxAttempts(-1),
		"WithParkedKey":      WithParkedKey(ParkedKeyPolicy(7)),
	} {
		if _, err := buildConfig([]Option{o}); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %v does not name it", name, err)
		}
	}
	if _, err := buildConfig([]Option{WithBatchSize(50), WithWindow(10)}); err == nil || !strings.Contains(err.Error(), "WithWindow") {
		t.Errorf("window below batch: %v", err)
	}
	if _, err := NewRelay(nil, PublisherFunc(nil)); err == nil {
		t.Error("nil store accepted")
	}
}

func TestRetryDelayGrows(t *testing.T) {
	r := &Relay{cfg: config{retryMin: time.Second, retryMax: 10 * time.Second}}
	want := []time.Duration{time.Second, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for n, w := range want {
		if d := r.retryDelay(n); d != w {
			t.Errorf("retryDelay(%d) = %v, want %v", n, d, w)
		}
	}
	if d := r.retryDelay(1000); d != 10*time.Second {
		t.Errorf("retryDelay(1000) = %v", d)
	}
}

// failingStore refuses every claim, counting them.
type failingStore struct{ claims atomic.Int64 }

func (s *failingStore) Claim(context.Context, int, int, ParkedKeyPolicy) (Claimed, error) {
	s.claims.Add(1)
	return nil, errors.New("database down")
}
func (s *failingStore) Pending(context.Context) (int64, time.Duration, error) { return 0, 0, nil }
func (s *failingStore) Prune(context.Context, time.Time, int) (int, error)    { return 0, nil }

// TestRunBackoffCappedByMaxBackoff: after failed claims the relay waits
// at most WithMaxBackoff, even when that is below the first backoff.
func TestRunBackoffCappedByMaxBackoff(t *testing.T) {
	st := &failingStore{}
	r, err := NewRelay(st, PublisherFunc(func(context.Context, string, ...*driver.Message) error { return nil }),
		WithMaxBackoff(10*time.Millisecond), WithPollInterval(time.Hour), WithRetention(0),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	// Uncapped doubling from 100ms would claim 3 times in 300ms.
	if n := st.claims.Load(); n < 10 {
		t.Fatalf("%d claims in 300ms with a 10ms maximum backoff", n)
	}
}

// oneClaim hands out its rows in one claim and keeps the outcome.
type oneClaim struct {
	rows    []*Row
	outcome *Outcome
}

func (s *oneClaim) Claim(context.Context, int, int, ParkedKeyPolicy) (Claimed, error) { return s, nil }
func (s *oneClaim) Pending(context.Context) (int64, time.Duration, error)             { return 0, 0, nil }
func (s *oneClaim) Prune(context.Context, time.Time, int) (int, error)                { return 0, nil }
func (s *oneClaim) Rows() []*Row                                                      { return s.rows }
func (s *oneClaim) Abort(context.Context) error                                       { return nil }
func (s *oneClaim) Finish(_ context.Context, o Outcome) error                         { s.outcome = &o; return nil }

// A failed batch holding rows due to be parked is published row by row:
// only the row that fails alone is parked, the rows before it are sent,
// and the rest are postponed with the batch's cause, none parked.
func TestIsolateParksOnlyTheFailingRow(t *testing.T) {
	st := &oneClaim{rows: []*Row{
		{Seq: 1, ID: "ok", Key: "k", Destination: "d", Attempts: 2},
		{Seq: 2, ID: "bad", Key: "k", Destination: "d", Attempts: 2},
		{Seq: 3, ID: "after", Key: "k", Destination: "d", Attempts: 2},
		{Seq: 4, ID: "other", Destination: "d", Attempts: 0},
	}}
	var calls [][]string
	pub := PublisherFunc(func(_ context.Context, _ string, msgs ...*driver.Message) error {
		var ids []string
		for _, m := range msgs {
			ids = append(ids, m.ID)
		}
		calls = append(calls, ids)
		if slices.Contains(ids, "bad") {
			return fmt.Errorf("rejected %d", len(ids))
		}
		return nil
	})
	var logs bytes.Buffer
	r, err := NewRelay(st, pub, WithMaxAttempts(3), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(context.Background()); n != 1 || err == nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	if len(calls) != 3 || len(calls[0]) != 4 || !slices.Equal(calls[1], []string{"ok"}) || !slices.Equal(calls[2], []string{"bad"}) {
		t.Fatalf("publish calls %v", calls)
	}
	o := st.outcome
	want := []Failure{
		{Seqs: []int64{2}, Cause: "rejected 1", Park: true},
		{Seqs: []int64{3, 4}, Cause: "rejected 4", RetryAfter: r.retryDelay(3)},
	}
	if !slices.Equal(o.Sent, []int64{1}) || len(o.Failed) != 2 || !reflect.DeepEqual(o.Failed, want) {
		t.Fatalf("outcome %+v, want sent [1] and failures %+v", o, want)
	}
	if s := r.Stats(); s.Parked != 1 || s.PublishErrors != 2 || s.Published != 1 {
		t.Fatalf("stats %+v", s)
	}
	for _, want := range []string{"row parked", "row=2", "id=bad", "key=k", "destination=d", "attempts=3", `cause="rejected 1"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the parking's log lacks %s:\n%s", want, logs.String())
		}
	}
}

func TestCauseIsCutAtACharacter(t *testing.T) {
	long := strings.Repeat("é", MaxCauseLength) // 2 bytes each
	c := Cause(errors.New(long))
	if len(c) > MaxCauseLength || !utf8.ValidString(c) || len(c) < MaxCauseLength-1 {
		t.Fatalf("cause of %d bytes, valid %v", len(c), utf8.ValidString(c))
	}
	if c := Cause(errors.New("short")); c != "short" {
		t.Fatalf("cause %q", c)
	}
}

// WithMaxAttempts(0) never parks, however often a row failed.
func TestMaxAttemptsZeroNeverParks(t *testing.T) {
	st := &oneClaim{rows: []*Row{{Seq: 1, ID: "a", Destination: "d", Attempts: 1000}}}
	pub := PublisherFunc(func(context.Context, string, ...*driver.Message) error { return errors.New("rejected") })
	r, err := NewRelay(st, pub, WithMaxAttempts(0), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	r.RunOnce(context.Background())
	if f := st.outcome.Failed; len(f) != 1 || f[0].Park || f[0].Cause != "rejected" || f[0].RetryAfter != DefaultRetryMax {
		t.Fatalf("failures %+v, want the row postponed by the longest delay", f)
	}
}
