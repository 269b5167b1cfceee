package docstest

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/servicetest"
)

// goPrograms returns the ```go blocks of text that are whole programs
// (package main), each found as firstGoBlock finds the first.
func goPrograms(text string) []string {
	var out []string
	var body []string
	in := false
	for _, l := range lines(text) {
		switch {
		case !in && strings.TrimRight(l, " \t") == "```go":
			in, body = true, nil
		case in && strings.HasPrefix(l, "```"):
			in = false
			if src := strings.Join(body, "\n") + "\n"; strings.HasPrefix(strings.TrimSpace(src), "package main") {
				out = append(out, src)
			}
		case in:
			body = append(body, l)
		}
	}
	return out
}

// httpProgram returns the whole Go program of docs/http.md that imports
// pkg.
func httpProgram(t *testing.T, pkg string) string {
	t.Helper()
	for _, src := range goPrograms(readFile(t, filepath.Join(repoRoot(t), "docs", "http.md"))) {
		if strings.Contains(src, `"`+pkg+`"`) {
			return src
		}
	}
	t.Fatalf("docs/http.md has no Go program importing %s", pkg)
	return ""
}

// Every whole Go program of docs/http.md builds against this checkout.
func TestHTTPProgramsBuild(t *testing.T) {
	progs := goPrograms(readFile(t, filepath.Join(repoRoot(t), "docs", "http.md")))
	if len(progs) < 3 {
		t.Fatalf("docs/http.md has %d whole Go programs, want the webhook inbox and two Idempotency-Key services", len(progs))
	}
	for i, src := range progs {
		buildProgram(t, "docs/http.md's Go program "+strconv.Itoa(i+1), src)
	}
}

// docs/http.md's Stripe inbox, run as its text says (one secret, a park
// directory it is given but that does not exist yet, PostgreSQL), takes a
// signed event once, answers its copy 200 too, and stops cleanly on an
// interrupt.
func TestHTTPStripeInboxRuns(t *testing.T) {
	bin := buildProgram(t, "docs/http.md's webhook inbox", httpProgram(t, "github.com/idemq/idemq/brokers/webhook"))
	dbURL := servicetest.PostgresURL(t)
	addr := "127.0.0.1:" + strconv.Itoa(servicetest.FreePort(t))
	const secret = "whsec_docstest"
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "STRIPE_SECRET="+secret, "DATABASE_URL="+dbURL,
		"PARK_DIR="+filepath.Join(t.TempDir(), "parked"), "ADDR="+addr)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })

	id := "evt_docstest_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	body := `{"id":"` + id + `","type":"customer.created","data":{"object":{}}}`
	post := func() (int, error) {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(ts + "." + body))
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/hooks/stripe", strings.NewReader(body))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(mac.Sum(nil)))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		res.Body.Close()
		return res.StatusCode, nil
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		status, err := post()
		if err == nil && status == http.StatusOK {
			break
		}
		select {
		case werr := <-exited:
			t.Fatalf("the program exited at start-up (%v):\n%s", werr, out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 200 within a minute (last: %d, %v):\n%s", status, err, out.String())
		}
	}
	if status, err := post(); err != nil || status != http.StatusOK {
		t.Fatalf("the copy: %d %v\n%s", status, err, out.String())
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE consumer = 'stripe-events' AND message_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d claims of the event, want 1", n)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the program did not stop cleanly: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the program did not stop within 30 s of an interrupt:\n%s", out.String())
	}
}

// syncBuffer is a bytes.Buffer a child process's output goes to while
// the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
