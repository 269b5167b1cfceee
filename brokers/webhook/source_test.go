package webhook

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

// A verified request is handed to the Consumer with its id, body, headers
// and metadata, and answered 200 once its effect is committed.
func TestAckAnswers200AfterCommit(t *testing.T) {
	r := newRig(t, nil, nil)
	mustStatus(t, send(githubRequest(t, r.url, "d-1", `{"n":1}`)), http.StatusOK)
	if n := r.effects("d-1"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	m := r.msg(0)
	md := driver.MetadataOf(m.Metadata)
	if m.ID != "d-1" || string(m.Body) != `{"n":1}` || m.Source != "/hooks/github" || m.System != "webhook" || m.Attempt != 1 ||
		m.Headers["x-github-delivery"] != "d-1" || m.Headers["traceparent"] == "" || m.Headers["content-type"] != "application/json" || m.ReceivedAt.IsZero() {
		t.Errorf("message %+v", m)
	}
	if md["http.request.method"] != "POST" || md["url.path"] != "/hooks/github" || md["client.address"] != "127.0.0.1" || md["webhook.profile"] != "github" {
		t.Errorf("metadata %v", md)
	}
}

// Copies sent one after the other are each answered 200; the effect is
// applied once.
func TestSequentialCopiesApplyOnce(t *testing.T) {
	r := newRig(t, nil, nil)
	for range 3 {
		mustStatus(t, send(githubRequest(t, r.url, "d-seq", "body")), http.StatusOK)
	}
	if n := r.effects("d-seq"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if st := r.c.Stats(); st.Processed != 1 || st.Duplicates != 2 {
		t.Errorf("stats %+v, want 1 processed and 2 duplicates", st)
	}
}

// Copies arriving while the first is with the Consumer wait for it and
// take its 200, without reaching the Consumer themselves.
func TestConcurrentCopiesWaitForTheFirst(t *testing.T) {
	release := make(chan struct{})
	r := newRig(t, func(*core.Message) error { <-release; return nil }, []Option{WithWait(20 * time.Second)})
	const n = 5
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers[i] = send(githubRequest(t, r.url, "d-conc", "body")) })
	}
	waitFor(t, "one delivery and the other copies waiting", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.seen) == 1 && r.src.copies.Load() == n-1
	})
	close(release)
	wg.Wait()
	for _, a := range answers {
		mustStatus(t, a, http.StatusOK)
	}
	if got := r.effects("d-conc"); got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
	if st := r.c.Stats(); st.Received != 1 || st.Processed != 1 {
		t.Errorf("stats %+v, want 1 received and processed", st)
	}
}

// A copy that waits past WithWait for the first is answered 409 with
// Retry-After; the first still settles.
func TestCopyPastTheWaitGets409(t *testing.T) {
	release := make(chan struct{})
	r := newRig(t, func(*core.Message) error { <-release; return nil }, []Option{WithWait(300 * time.Millisecond)})
	first := make(chan answer, 1)
	go func() { first <- send(githubRequest(t, r.url, "d-409", "body")) }()
	waitFor(t, "the first copy with the handler", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.seen) == 1 })
	a := send(githubRequest(t, r.url, "d-409", "body"))
	mustStatus(t, a, http.StatusConflict)
	if a.retryAfter != "1" {
		t.Errorf("Retry-After %q, want 1", a.retryAfter)
	}
	close(release)
	mustStatus(t, <-first, http.StatusOK)
	if got := r.effects("d-409"); got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
}

// A handler error is answered 503 with Retry-After and rolled back; the
// sender's next copy, one attempt later, is applied once.
func TestHandlerErrorAnswers503ThenRetrySucceeds(t *testing.T) {
	var calls atomic.Int32
	r := newRig(t, func(*core.Message) error {
		if calls.Add(1) == 1 {
			return errors.New("ledger unavailable")
		}
		return nil
	}, nil)
	a := send(githubRequest(t, r.url, "d-retry", "body"))
	mustStatus(t, a, http.StatusServiceUnavailable)
	if a.retryAfter == "" || a.retryAfter == "0" {
		t.Errorf("Retry-After %q, want at least 1", a.retryAfter)
	}
	if n := r.effects("d-retry"); n != 0 {
		t.Fatalf("%d effects after the failure, want 0", n)
	}
	mustStatus(t, send(githubRequest(t, r.url, "d-retry", "body")), http.StatusOK)
	if n := r.effects("d-retry"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if r.msg(1).Attempt != 2 {
		t.Errorf("second copy's attempt %d, want 2", r.msg(1).Attempt)
	}
}

// A poison message is parked in a file and answered 200.
func TestPoisonMessageIsParked(t *testing.T) {
	r := newRig(t, func(*core.Message) error { return core.Permanent(errors.New("invoice\nmalformed")) }, nil)
	a := send(githubRequest(t, r.url, "d-poison", `{"bad":true}`))
	mustStatus(t, a, http.StatusOK)
	ps := parkedFiles(t, r.dir)
	if len(ps) != 1 {
		t.Fatalf("%d parked files, want 1", len(ps))
	}
	p := ps[0]
	if p.Version != 1 || p.ID != "d-poison" || !strings.Contains(p.Cause, "invoice malformed") || p.Attempt != 1 || p.Profile != "github" ||
		p.Method != "POST" || p.Path != "/hooks/github" || string(p.Body) != `{"bad":true}` || p.Headers.Get("X-GitHub-Delivery") != "d-poison" ||
		p.Headers.Get(signature.HeaderGitHubSignature) == "" || p.ReceivedAt.IsZero() || p.ParkedAt.Before(p.ReceivedAt) || !strings.HasPrefix(p.RemoteAddr, "127.0.0.1:") {
		t.Errorf("parked %+v", p)
	}
	if n := r.effects("d-poison"); n != 0 {
		t.Fatalf("%d effects, want 0", n)
	}
	// The Consumer counts a dead letter once DeadLetter returned, after
	// the answer went out.
	waitFor(t, "the dead letter counted", func() bool { return r.c.Stats().DeadLettered == 1 })
}

// The Source counts the retries of an event, so the Consumer's maximum
// attempts park a message that keeps failing.
func TestMaxAttemptsParks(t *testing.T) {
	r := newRig(t, func(*core.Message) error { return errors.New("always") }, nil, core.WithMaxAttempts(2))
	mustStatus(t, send(githubRequest(t, r.url, "d-max", "body")), http.StatusServiceUnavailable)
	mustStatus(t, send(githubRequest(t, r.url, "d-max", "body")), http.StatusOK)
	ps := parkedFiles(t, r.dir)
	if len(ps) != 1 || ps[0].Attempt != 2 || ps[0].ID != "d-max" {
		t.Fatalf("parked %+v, want d-max at attempt 2", ps)
	}
}

// A request that does not verify is answered 401 and reaches neither the
// Consumer nor the store.
func TestBadSignatureAnswers401(t *testing.T) {
	r := newRig(t, nil, nil)
	forged := githubRequest(t, r.url, "d-forged", "body")
	forged.Header.Set(signature.HeaderGitHubSignature, "sha256="+strings.Repeat("ab", 32))
	a := send(forged)
	mustStatus(t, a, http.StatusUnauthorized)
	if strings.TrimSpace(a.body) != "bad signature" {
		t.Errorf("body %q, want the failed check only", a.body)
	}
	unsigned := githubRequest(t, r.url, "d-unsigned", "body")
	unsigned.Header.Del(signature.HeaderGitHubSignature)
	mustStatus(t, send(unsigned), http.StatusUnauthorized)
	if st := r.c.Stats(); st.Received != 0 {
		t.Errorf("stats %+v, want nothing received", st)
	}
	if n := r.claims(); n != 0 {
		t.Errorf("%d claims, want none", n)
	}
	if ps := parkedFiles(t, r.dir); len(ps) != 0 {
		t.Errorf("%d parked, want none", len(ps))
	}
}

// A Standard Webhooks request signed outside the tolerance is answered 401.
func TestStaleTimestampAnswers401(t *testing.T) {
	p, err := signature.StandardWebhooks([]string{stdSecret})
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(WithProfile(p), WithParkDir(t.TempDir()), WithWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	srv := httptest.NewServer(src)
	defer srv.Close()
	a := send(standardRequest(t, srv.URL, "msg_1", time.Now().Add(-time.Hour), "{}"))
	mustStatus(t, a, http.StatusUnauthorized)
	if strings.TrimSpace(a.body) != "bad timestamp" {
		t.Errorf("body %q", a.body)
	}
	// In time, it verifies; nothing takes it, so it is answered 503.
	mustStatus(t, send(standardRequest(t, srv.URL, "msg_1", time.Now(), "{}")), http.StatusServiceUnavailable)
}

// A verified request without an event id is parked and answered 200,
// never processed.
func TestNoIDIsParked(t *testing.T) {
	r := newRig(t, nil, nil)
	mustStatus(t, send(githubRequest(t, r.url, "", "no id here")), http.StatusOK)
	ps := parkedFiles(t, r.dir)
	if len(ps) != 1 || ps[0].ID != "" || !strings.Contains(ps[0].Cause, "no event id") || string(ps[0].Body) != "no id here" {
		t.Fatalf("parked %+v", ps)
	}
	if st := r.c.Stats(); st.Received != 0 {
		t.Errorf("stats %+v, want nothing received", st)
	}
}

// A body over the limit is answered 413, with or without a length.
func TestOversizeAnswers413(t *testing.T) {
	r := newRig(t, nil, []Option{WithMaxBody(16)})
	mustStatus(t, send(githubRequest(t, r.url, "d-big", strings.Repeat("x", 17))), http.StatusRequestEntityTooLarge)
	chunked := githubRequest(t, r.url, "d-big", strings.Repeat("x", 17))
	chunked.Body, chunked.ContentLength = io.NopCloser(strings.NewReader(strings.Repeat("x", 17))), -1
	mustStatus(t, send(chunked), http.StatusRequestEntityTooLarge)
	mustStatus(t, send(githubRequest(t, r.url, "d-fits", strings.Repeat("x", 16))), http.StatusOK)
	if st := r.c.Stats(); st.Received != 1 {
		t.Errorf("stats %+v, want only the one that fits", st)
	}
}

// A body cut short is answered 400.
func TestTruncatedBodyAnswers400(t *testing.T) {
	r := newRig(t, nil, nil)
	conn, err := net.Dial("tcp", r.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /hooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten b"); err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", resp.StatusCode)
	}
}

// Only POST is taken.
func TestMethodNotAllowed(t *testing.T) {
	r := newRig(t, nil, nil)
	resp, err := http.Get(r.url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("status %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

// bare is a Source on a GitHub profile served by an httptest server, with
// no Consumer: the test drives it with a brokertest.Receiver, or not at
// all.
func bare(t *testing.T, opts ...Option) (*Source, string, string) {
	t.Helper()
	p, err := signature.GitHub([]string{ghSecret})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src, err := NewSource(append([]Option{WithProfile(p), WithParkDir(dir)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(src)
	t.Cleanup(func() { src.Close(); srv.Close() })
	return src, srv.URL, dir
}

func (s *Source) inFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.flights)
}

// A request nothing takes is answered 503 with Retry-After once the wait
// bound passes.
func TestBackPressureAnswers503(t *testing.T) {
	src, url, _ := bare(t, WithWait(100*time.Millisecond))
	a := send(githubRequest(t, url, "d-bp", "body"))
	mustStatus(t, a, http.StatusServiceUnavailable)
	if a.retryAfter != "1" {
		t.Errorf("Retry-After %q, want 1", a.retryAfter)
	}
	if n := src.inFlight(); n != 0 {
		t.Errorf("%d in flight, want 0", n)
	}
}

// The Consumer's window bounds the requests it holds unsettled: one
// beyond it waits for room.
func TestWindowBoundsReceive(t *testing.T) {
	src, url, _ := bare(t, WithWait(20*time.Second))
	r := brokertest.StartReceiver(t, src, 1)
	a1, a2 := make(chan answer, 1), make(chan answer, 1)
	go func() { a1 <- send(githubRequest(t, url, "w-1", "body")) }()
	d1, err := r.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	go func() { a2 <- send(githubRequest(t, url, "w-2", "body")) }()
	waitFor(t, "the second request waiting", func() bool { return src.inFlight() == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := r.Receive(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive with the window full: %v, want the context's deadline", err)
	}
	if err := d1.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustStatus(t, <-a1, http.StatusOK)
	d2, err := r.Receive(context.Background())
	if err != nil || d2.Message().ID != "w-2" {
		t.Fatalf("Receive = %v, %v", d2, err)
	}
	if err := d2.Retry(context.Background(), 2500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	a := <-a2
	mustStatus(t, a, http.StatusServiceUnavailable)
	if a.retryAfter != "3" {
		t.Errorf("Retry-After %q, want 3 (2.5 s rounded up)", a.retryAfter)
	}
	if err := d2.Ack(context.Background()); !errors.Is(err, driver.ErrAlreadySettled) {
		t.Errorf("second settlement: %v, want ErrAlreadySettled", err)
	}
	if tr := r.Traits(); !tr.DelaysRetry {
		t.Errorf("traits %+v: the sender waits out Retry-After, so DelaysRetry", tr)
	}
}

// A request beyond the Consumer's window waits for room up to the wait
// bound, and is then answered 503 with Retry-After and never reaches the
// Consumer, even once room frees.
func TestWindowFullAnswersBusy(t *testing.T) {
	src, url, _ := bare(t, WithWait(100*time.Millisecond), WithAnswerBy(1500*time.Millisecond))
	r := brokertest.StartReceiver(t, src, 1)
	first := make(chan answer, 1)
	go func() { first <- send(githubRequest(t, url, "full-1", "body")) }()
	d, err := r.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan answer, 1)
	go func() { second <- send(githubRequest(t, url, "full-2", "body")) }()
	waitFor(t, "the second request waiting", func() bool { return src.inFlight() == 2 })
	// The bound under test: well past the second's wait for room (100 ms),
	// well before the first's answer bound (1.5 s).
	time.Sleep(500 * time.Millisecond)
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustStatus(t, <-first, http.StatusOK)
	a := <-second
	mustStatus(t, a, http.StatusServiceUnavailable)
	if a.retryAfter != "1" {
		t.Errorf("Retry-After %q, want 1", a.retryAfter)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if d, err := r.Receive(ctx); err == nil {
		t.Errorf("the request answered busy was delivered: %s", d.Message().ID)
	}
	if n := src.inFlight(); n != 0 {
		t.Errorf("%d in flight, want 0", n)
	}
}

// A sender that leaves before the settlement changes nothing: the
// message settles (here, parks) all the same.
func TestSenderGoneStillSettles(t *testing.T) {
	src, url, dir := bare(t, WithWait(20*time.Second))
	r := brokertest.StartReceiver(t, src, 0)
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan answer, 1)
	go func() { gone <- send(githubRequest(t, url, "d-gone", "body").WithContext(ctx)) }()
	d, err := r.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if a := <-gone; a.err == nil {
		t.Fatalf("the sender got %d, want its own cancellation", a.status)
	}
	if err := d.DeadLetter(context.Background(), errors.New("refused by the handler")); err != nil {
		t.Fatal(err)
	}
	if ps := parkedFiles(t, dir); len(ps) != 1 || ps[0].ID != "d-gone" {
		t.Fatalf("parked %+v", ps)
	}
	if n, held := src.inFlight(), r.Held(); n != 0 || held != 0 {
		t.Errorf("%d in flight, %d held; want none", n, held)
	}
}

// Close answers new and waiting requests 503; a request the Consumer
// holds when it stops settles normally; one it gives back at its Close is
// answered 503 and its settlement is stale.
func TestClose(t *testing.T) {
	t.Run("waiting", func(t *testing.T) {
		src, url, _ := bare(t, WithWait(30*time.Second))
		a := make(chan answer, 1)
		go func() { a <- send(githubRequest(t, url, "c-1", "body")) }()
		waitFor(t, "the request waiting", func() bool { return src.inFlight() == 1 })
		start := time.Now()
		src.Close()
		mustStatus(t, <-a, http.StatusServiceUnavailable)
		if time.Since(start) > 10*time.Second {
			t.Error("the waiting request was answered only after the wait bound")
		}
		mustStatus(t, send(githubRequest(t, url, "c-2", "body")), http.StatusServiceUnavailable)
		if err := src.Serve(context.Background(), nil); !errors.Is(err, driver.ErrSourceClosed) {
			t.Errorf("Serve after Close: %v", err)
		}
	})
	t.Run("waiting for room", func(t *testing.T) {
		src, url, _ := bare(t, WithWait(30*time.Second))
		r := brokertest.StartReceiver(t, src, 1)
		held := make(chan answer, 1)
		go func() { held <- send(githubRequest(t, url, "c-held", "body")) }()
		if _, err := r.Receive(context.Background()); err != nil {
			t.Fatal(err)
		}
		a := make(chan answer, 1)
		go func() { a <- send(githubRequest(t, url, "c-room", "body")) }()
		waitFor(t, "the request waiting for room", func() bool { return src.inFlight() == 2 })
		start := time.Now()
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		mustStatus(t, <-a, http.StatusServiceUnavailable)
		mustStatus(t, <-held, http.StatusServiceUnavailable)
		if time.Since(start) > 10*time.Second {
			t.Error("the waiting request was answered only after the wait bound")
		}
	})
	t.Run("held when the consumer stops settles", func(t *testing.T) {
		release := make(chan struct{})
		r := newRig(t, func(*core.Message) error { <-release; return nil }, []Option{WithWait(30 * time.Second)})
		a := make(chan answer, 1)
		go func() { a <- send(githubRequest(t, r.url, "c-3", "body")) }()
		waitFor(t, "the request with the handler", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.seen) == 1 })
		r.stop()
		close(release)
		mustStatus(t, <-a, http.StatusOK)
		if err := r.wait(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if n := r.effects("c-3"); n != 1 {
			t.Fatalf("%d effects, want 1", n)
		}
		mustStatus(t, send(githubRequest(t, r.url, "c-4", "body")), http.StatusServiceUnavailable)
	})
	t.Run("given back", func(t *testing.T) {
		src, url, _ := bare(t, WithWait(100*time.Millisecond))
		r := brokertest.StartReceiver(t, src, 0)
		a := make(chan answer, 1)
		go func() { a <- send(githubRequest(t, url, "c-5", "body")) }()
		d, err := r.Receive(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		mustStatus(t, <-a, http.StatusServiceUnavailable)
		if err := d.Ack(context.Background()); !errors.Is(err, driver.ErrStaleDelivery) {
			t.Errorf("Ack after the give-back: %v, want ErrStaleDelivery", err)
		}
	})
}

// NewSource needs a profile and a writable park directory.
func TestNewSourceRequires(t *testing.T) {
	p, _ := signature.GitHub([]string{ghSecret})
	for want, opts := range map[string][]Option{
		"option WithProfile: required":  {WithParkDir(t.TempDir())},
		"option WithParkDir: required":  {WithProfile(p)},
		"option WithParkDir: stat":      {WithProfile(p), WithParkDir("/nonexistent/parked")},
		"option WithMaxBody: 0 must be": {WithProfile(p), WithParkDir(t.TempDir()), WithMaxBody(0)},
		"option WithWait: -1s must be":  {WithProfile(p), WithParkDir(t.TempDir()), WithWait(-time.Second)},
		"option WithProfile: nil":       {WithProfile(nil)},
		"option WithParkDir: empty":     {WithParkDir("")},
		"option WithLogger: nil":        {WithLogger(nil)},
	} {
		if _, err := NewSource(opts...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NewSource: %v, want %q", err, want)
		}
	}
}

// An IDFunc that changes the id changes nothing for the inbox: copies are
// still told apart by the event id, and nothing stays in flight.
func TestIDFuncLeavesNoFlight(t *testing.T) {
	r := newRig(t, nil, nil, core.WithIDFunc(func(m *core.Message) (string, error) { return "repo-1/" + m.ID, nil }))
	mustStatus(t, send(githubRequest(t, r.url, "d-idf", "body")), http.StatusOK)
	mustStatus(t, send(githubRequest(t, r.url, "d-idf", "body")), http.StatusOK)
	if n := r.effects("repo-1/d-idf"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if n := r.src.inFlight(); n != 0 {
		t.Errorf("%d in flight, want 0", n)
	}
}

// A copy waiting for a first copy that is retried takes the first one's
// 503 and Retry-After.
func TestCopyTakesTheFirstsRetry(t *testing.T) {
	release := make(chan struct{})
	r := newRig(t, func(*core.Message) error { <-release; return errors.New("not yet") }, []Option{WithWait(20 * time.Second)})
	first := make(chan answer, 1)
	go func() { first <- send(githubRequest(t, r.url, "d-cr", "body")) }()
	waitFor(t, "the first copy with the handler", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.seen) == 1 })
	copied := make(chan answer, 1)
	go func() { copied <- send(githubRequest(t, r.url, "d-cr", "body")) }()
	waitFor(t, "the copy waiting", func() bool { return r.src.copies.Load() == 1 })
	close(release)
	a, b := <-first, <-copied
	mustStatus(t, a, http.StatusServiceUnavailable)
	mustStatus(t, b, http.StatusServiceUnavailable)
	if a.retryAfter != b.retryAfter || b.retryAfter == "" {
		t.Errorf("Retry-After %q and %q, want the same", a.retryAfter, b.retryAfter)
	}
	if st := r.c.Stats(); st.Received != 1 {
		t.Errorf("stats %+v, want 1 received", st)
	}
}

// A request that cannot be parked is answered 503, so that its sender
// sends it again: never dropped.
func TestParkFailureAnswers503(t *testing.T) {
	r := newRig(t, func(*core.Message) error { return core.Permanent(errors.New("poison")) }, nil)
	if err := os.RemoveAll(r.dir); err != nil {
		t.Fatal(err)
	}
	mustStatus(t, send(githubRequest(t, r.url, "", "no id")), http.StatusServiceUnavailable)
	mustStatus(t, send(githubRequest(t, r.url, "d-unparked", "body")), http.StatusServiceUnavailable)
	waitFor(t, "the failed park counted", func() bool { return r.c.Stats().SettleErrors == 1 })
	// With the directory back, the sender's next copy is parked.
	if err := os.Mkdir(r.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	mustStatus(t, send(githubRequest(t, r.url, "d-unparked", "body")), http.StatusOK)
	if ps := parkedFiles(t, r.dir); len(ps) != 1 || ps[0].ID != "d-unparked" {
		t.Fatalf("parked %+v", ps)
	}
}

// Many events and their copies, concurrently and with several workers:
// each event applied once, every request answered 200.
func TestManyEventsConcurrently(t *testing.T) {
	r := newRig(t, nil, []Option{WithWait(20 * time.Second)}, core.WithConcurrency(4))
	const events, copies = 20, 3
	var wg sync.WaitGroup
	var bad atomic.Int32
	for e := range events {
		for range copies {
			wg.Go(func() {
				id := "d-many-" + strconv.Itoa(e)
				if a := send(githubRequest(t, r.url, id, id)); a.err != nil || a.status != http.StatusOK {
					bad.Add(1)
				}
			})
		}
	}
	wg.Wait()
	if n := bad.Load(); n != 0 {
		t.Fatalf("%d requests not answered 200", n)
	}
	for e := range events {
		if n := r.effects("d-many-" + strconv.Itoa(e)); n != 1 {
			t.Fatalf("event %d applied %d times", e, n)
		}
	}
}
