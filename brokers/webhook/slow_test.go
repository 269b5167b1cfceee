package webhook

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/sqlite"
)

// A handler slower than WithAnswerBy: the request is answered 503 with
// Retry-After while the effect goes on and commits once; a copy sent
// meanwhile waits for that settlement, and one sent later is a Duplicate.
func TestSlowHandlerIsAnsweredByTheBound(t *testing.T) {
	release := make(chan struct{})
	r := newRig(t, func(*core.Message) error { <-release; return nil },
		[]Option{WithAnswerBy(300 * time.Millisecond), WithWait(20 * time.Second)})
	a := send(githubRequest(t, r.url, "d-slow", "body"))
	mustStatus(t, a, http.StatusServiceUnavailable)
	if a.retryAfter == "" {
		t.Error("503 without Retry-After")
	}
	copied := make(chan answer, 1)
	go func() { copied <- send(githubRequest(t, r.url, "d-slow", "body")) }()
	waitFor(t, "the copy waiting for the first", func() bool { return r.src.copies.Load() == 1 })
	close(release)
	mustStatus(t, <-copied, http.StatusOK)
	mustStatus(t, send(githubRequest(t, r.url, "d-slow", "body")), http.StatusOK)
	if got := r.effects("d-slow"); got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
	if st := r.c.Stats(); st.Processed != 1 || st.Duplicates != 1 {
		t.Errorf("stats %+v, want 1 processed and 1 duplicate", st)
	}
}

// replica is one instance of a service taking webhooks with a leased
// Consumer: its Source in an HTTP server, sharing the store with the
// other replicas.
type replica struct {
	src *Source
	c   *core.Consumer[*sql.Tx]
	url string
}

func newReplica(t *testing.T, store *sqlite.Store, park string, h core.LeasedHandler[*sql.Tx, string], opts ...Option) *replica {
	t.Helper()
	p, err := signature.GitHub([]string{ghSecret})
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(append([]Option{WithProfile(p), WithParkDir(park)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.NewLeased(src, store, h, core.WithName("charges"), core.WithShutdownTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(src)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
		srv.Close()
	})
	return &replica{src: src, c: c, url: srv.URL}
}

// A leased effect slower than the sender's timeout, with two replicas
// behind one endpoint: the first request is answered 503 while the call
// goes on; a copy at the other replica meets the live lease and is
// answered 503 with Retry-After; once the completion commits, every copy
// is answered 200; the call was made once and the effect applied once.
func TestLeasedSlowEffectAcrossReplicas(t *testing.T) {
	dir := t.TempDir()
	park := filepath.Join(dir, "parked")
	if err := os.Mkdir(park, 0o700); err != nil {
		t.Fatal(err)
	}
	store, err := sqlite.Open(context.Background(), filepath.Join(dir, "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.DB().Exec(`CREATE TABLE charges (id TEXT NOT NULL, result TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	release := make(chan struct{})
	h := core.LeasedHandler[*sql.Tx, string]{
		External: func(ctx context.Context, m *core.Message) (string, error) {
			calls.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
				return "", ctx.Err()
			}
			return "ch_" + m.ID, nil
		},
		Complete: func(ctx context.Context, tx *sql.Tx, m *core.Message, result string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO charges (id, result) VALUES (?, ?)`, m.ID, result)
			return err
		},
	}
	a := newReplica(t, store, park, h, WithAnswerBy(300*time.Millisecond))
	b := newReplica(t, store, park, h, WithAnswerBy(300*time.Millisecond))

	first := send(githubRequest(t, a.url, "evt-slow", "charge"))
	mustStatus(t, first, http.StatusServiceUnavailable)
	other := send(githubRequest(t, b.url, "evt-slow", "charge"))
	mustStatus(t, other, http.StatusServiceUnavailable)
	if other.retryAfter == "" {
		t.Error("the copy at the other replica got 503 without Retry-After")
	}
	close(release)
	waitFor(t, "the completion", func() bool { return a.c.Stats().Processed == 1 })
	for _, rep := range []*replica{a, b} {
		mustStatus(t, send(githubRequest(t, rep.url, "evt-slow", "charge")), http.StatusOK)
	}
	var n int
	if err := store.DB().QueryRow(`SELECT count(*) FROM charges WHERE id = 'evt-slow'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || calls.Load() != 1 {
		t.Fatalf("%d effects and %d calls, want 1 and 1", n, calls.Load())
	}
}

// The Source reports the provider's retry window as its redelivery
// horizon, so the Consumer warns when the store keeps claims for less.
func TestHorizonAgainstRetention(t *testing.T) {
	for _, c := range []struct {
		profile string
		opts    []Option
		want    time.Duration
	}{
		{"stripe", nil, 72 * time.Hour},
		{"standard", nil, 28 * time.Hour},
		{"shopify", nil, 4 * time.Hour},
		{"github", []Option{WithHorizon(time.Minute)}, time.Minute},
	} {
		secret := ghSecret
		if c.profile == "standard" {
			secret = stdSecret
		}
		p, err := signature.Open(c.profile, []string{secret})
		if err != nil {
			t.Fatal(err)
		}
		src, err := NewSource(append([]Option{WithProfile(p), WithParkDir(t.TempDir())}, c.opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := src.RedeliveryHorizon(context.Background()); !ok || got != c.want {
			t.Errorf("%s: horizon %v %v, want %v", c.profile, got, ok, c.want)
		}
	}

	p, err := signature.Stripe([]string{stripeSecret})
	if err != nil {
		t.Fatal(err)
	}
	brokertest.RetentionAgainstHorizon(t, func(t *testing.T) driver.Source {
		src, err := NewSource(WithProfile(p), WithParkDir(t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		return src
	}, 24*time.Hour, "72h0m0s")
}

// A handler slower than both WithWait and WithAnswerBy: the first request
// is answered 503 at the bound, and a copy sent after that still waits for
// the first's settlement (never reaching the Consumer beside it), then
// takes its 200.
func TestSlowerThanTheWaitHoldsCopiesBack(t *testing.T) {
	release := make(chan struct{})
	r := newRig(t, func(*core.Message) error { <-release; return nil },
		[]Option{WithWait(200 * time.Millisecond), WithAnswerBy(300 * time.Millisecond)})
	mustStatus(t, send(githubRequest(t, r.url, "d-slower", "body")), http.StatusServiceUnavailable)
	time.Sleep(200 * time.Millisecond) // past the first's bounds
	copied := make(chan answer, 1)
	go func() { copied <- send(githubRequest(t, r.url, "d-slower", "body")) }()
	waitFor(t, "the copy waiting for the first", func() bool { return r.src.copies.Load() == 1 })
	close(release)
	mustStatus(t, <-copied, http.StatusOK)
	if st := r.c.Stats(); st.Received != 1 {
		t.Errorf("stats %+v, want the copy held back: 1 received", st)
	}
}
