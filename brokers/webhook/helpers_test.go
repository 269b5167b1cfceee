package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/sqlite"
)

const (
	ghSecret     = "It's a Secret to Everybody"
	stripeSecret = "whsec_test_s3cr3t"
)

// stdSecret is a Standard Webhooks secret: whsec_ and a base64 key.
var stdSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("standard webhooks key 0123456789"))

func mac(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

// githubRequest is a POST of body to url signed as GitHub signs it, with
// delivery id id ("" for none).
func githubRequest(t testing.TB, url, id, body string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(signature.HeaderGitHubSignature, "sha256="+hex.EncodeToString(mac([]byte(ghSecret), body)))
	if id != "" {
		r.Header.Set(signature.HeaderGitHubDelivery, id)
	}
	r.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	return r
}

// standardRequest is a POST signed as Standard Webhooks signs it at ts.
func standardRequest(t testing.TB, url, id string, ts time.Time, body string) *http.Request {
	t.Helper()
	key, _ := base64.StdEncoding.DecodeString(stdSecret[len("whsec_"):])
	unix := strconv.FormatInt(ts.Unix(), 10)
	r, err := http.NewRequest(http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set(signature.HeaderWebhookID, id)
	r.Header.Set(signature.HeaderWebhookTimestamp, unix)
	r.Header.Set(signature.HeaderWebhookSignature, "v1,"+base64.StdEncoding.EncodeToString(mac(key, id+"."+unix+"."+body)))
	return r
}

// stripeRequest is a POST signed as Stripe signs it, now.
func stripeRequest(t testing.TB, url, body string) *http.Request {
	t.Helper()
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	r, err := http.NewRequest(http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set(signature.HeaderStripeSignature, "t="+ts+",v1="+hex.EncodeToString(mac([]byte(stripeSecret), ts+"."+body)))
	return r
}

// answer is what a request got back.
type answer struct {
	status     int
	retryAfter string
	body       string
	err        error
}

func send(r *http.Request) answer {
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b)}
}

func mustStatus(t testing.TB, a answer, status int) {
	t.Helper()
	if a.err != nil || a.status != status {
		t.Fatalf("answer %d %q (err %v), want %d", a.status, a.body, a.err, status)
	}
}

// waitFor polls cond until it holds, failing after a deadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// rig is a Source mounted in an httptest server, a Consumer running it on
// an SQLite store, and the effects table the handler writes.
type rig struct {
	t     *testing.T
	src   *Source
	store *sqlite.Store
	srv   *httptest.Server
	c     *core.Consumer[*sql.Tx]
	dir   string
	url   string
	stop  context.CancelFunc // stops the Consumer
	ran   chan error         // Run's result

	mu   sync.Mutex
	seen []*core.Message // messages the handler was called with
}

// effect records m in the effects table, in the dedup transaction.
func effect(ctx context.Context, tx *sql.Tx, m *core.Message) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (id, body) VALUES (?, ?)`, m.ID, string(m.Body))
	return err
}

// newRig starts a rig whose handler applies the effect, then returns what
// then returns (nil: no error).
func newRig(t *testing.T, then func(m *core.Message) error, srcOpts []Option, cOpts ...core.Option) *rig {
	t.Helper()
	dir := t.TempDir()
	park := filepath.Join(dir, "parked")
	if err := os.Mkdir(park, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.DB().Exec(`CREATE TABLE effects (id TEXT NOT NULL, body TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	p, err := signature.GitHub([]string{ghSecret})
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(append([]Option{WithProfile(p), WithParkDir(park)}, srcOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, src: src, store: store, dir: park}
	c, err := core.New(src, store, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		r.mu.Lock()
		r.seen = append(r.seen, m)
		r.mu.Unlock()
		if err := effect(ctx, tx, m); err != nil {
			return err
		}
		if then != nil {
			return then(m)
		}
		return nil
	}, append([]core.Option{core.WithName("billing"), core.WithShutdownTimeout(5 * time.Second)}, cOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	r.c, r.stop, r.ran = c, cancel, make(chan error, 1)
	mux := http.NewServeMux()
	mux.Handle("/hooks/github", src)
	r.srv = httptest.NewServer(mux)
	r.url = r.srv.URL + "/hooks/github"
	go func() { r.ran <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := r.wait(); err != nil {
			t.Errorf("Run: %v", err)
		}
		r.srv.Close()
		store.Close()
	})
	return r
}

// wait returns Run's result once the Consumer stopped (r.stop), or an
// error if it does not stop in time. It may be called more than once.
func (r *rig) wait() error {
	select {
	case err, ok := <-r.ran:
		if ok {
			close(r.ran)
		}
		return err
	case <-time.After(15 * time.Second):
		return errors.New("Run did not return")
	}
}

// msg returns the i-th message the handler was called with.
func (r *rig) msg(i int) *core.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i >= len(r.seen) {
		r.t.Fatalf("the handler saw %d messages, not %d", len(r.seen), i+1)
	}
	return r.seen[i]
}

// effects counts the effects applied for id.
func (r *rig) effects(id string) int {
	r.t.Helper()
	var n int
	if err := r.store.DB().QueryRow(`SELECT count(*) FROM effects WHERE id = ?`, id).Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

// claims counts the dedup table's rows.
func (r *rig) claims() int {
	r.t.Helper()
	var n int
	if err := r.store.DB().QueryRow(`SELECT count(*) FROM processed_messages`).Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

// parkedFiles reads the parked requests in dir.
func parkedFiles(t testing.TB, dir string) []*ParkedRequest {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var out []*ParkedRequest
	for _, n := range names {
		p, err := ReadParked(n)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}
