package main

import (
	"bytes"
	"context"
	"html"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
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

// serveConsole runs idemq console with args on a free loopback port until
// the test ends, and returns its base URL.
func serveConsole(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"console", "--listen", "127.0.0.1:0"}, args...), &out, &errOut)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("idemq console exited %d\n%s", code, errOut.String())
		}
	})
	addr := regexp.MustCompile(`serving (http://[0-9.:]+)/`)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		select {
		case code := <-done:
			done <- code
			t.Fatalf("idemq console exited %d before serving\n%s\n%s", code, out.String(), errOut.String())
		default:
		}
	}
	t.Fatalf("idemq console did not serve within 10s\n%s", out.String())
	return ""
}

func get(t *testing.T, url, user, pass string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The console serves the store's consumers; with credentials in the
// environment it asks for them; without, it serves only on loopback.
func TestConsole(t *testing.T) {
	storeURL := "sqlite://" + filepath.Join(t.TempDir(), "ops.db") + "?table=claims"
	expect(t, exitOK, []string{"migrate", "--store", storeURL}, "is ready")

	base := serveConsole(t, "--store", storeURL, "--consumer", "billing")
	if code, body := get(t, base+"/", "", ""); code != http.StatusOK || !strings.Contains(body, "billing") {
		t.Errorf("GET / without credentials configured: %d\n%s", code, body)
	}
	consoleWithoutPassword(t, base)

	t.Setenv(consoleUserEnv, "ops")
	t.Setenv(consolePasswordEnv, "s3cret-pass")
	base = serveConsole(t, "--store", storeURL, "--consumer", "billing", "--read-only")
	if code, _ := get(t, base+"/", "", ""); code != http.StatusUnauthorized {
		t.Errorf("GET / without credentials: %d, want 401", code)
	}
	if code, _ := get(t, base+"/", "ops", "wrong"); code != http.StatusUnauthorized {
		t.Errorf("GET / with a wrong password: %d, want 401", code)
	}
	if code, body := get(t, base+"/", "ops", "s3cret-pass"); code != http.StatusOK || !strings.Contains(body, "billing") || strings.Contains(body, "s3cret-pass") {
		t.Errorf("GET / with credentials: %d\n%s", code, body)
	}
}

func TestConsoleUsage(t *testing.T) {
	storeURL := "sqlite://" + filepath.Join(t.TempDir(), "ops.db")
	expect(t, exitUsage, []string{"console", "--store", storeURL, "--consumer", "c", "--listen", "0.0.0.0:0"}, "not a loopback address", consoleUserEnv)
	r := expect(t, exitUsage, []string{"console", "--store", storeURL, "--broker", "amqp://u:pw@127.0.0.1:1/?queue=q"}, "want CONSUMER=URL")
	if strings.Contains(r.stdout+r.stderr, ":pw@") {
		t.Errorf("the usage error shows the password:\n%s", r)
	}
	t.Setenv(consoleUserEnv, "ops")
	expect(t, exitUsage, []string{"console", "--store", storeURL, "--consumer", "c"}, "set both")
}

// consoleWithoutPassword: the console served without a password answers
// only requests to a loopback name, and its actions work, each request on
// a connection of its own as a browser's may be.
func consoleWithoutPassword(t *testing.T, base string) {
	t.Helper()
	_, port, _ := strings.Cut(strings.TrimPrefix(base, "http://"), ":")
	// A page of evil.example, whose DNS name points at 127.0.0.1, asks
	// under its own name.
	for host, want := range map[string]int{"evil.example:" + port: http.StatusMisdirectedRequest, "127.0.0.1.nip.io:" + port: http.StatusMisdirectedRequest,
		"localhost:" + port: http.StatusOK, "127.0.0.1:" + port: http.StatusOK, "LOCALHOST.:" + port: http.StatusOK} {
		req, _ := http.NewRequest(http.MethodGet, base+"/lookup", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET /lookup as Host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get(base + "/forget?consumer=billing&id=inv-1")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	form := url.Values{"confirm": {"inv-1"}}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(string(page), -1) {
		form.Set(m[1], html.UnescapeString(m[2]))
	}
	resp, err = hc.PostForm(base+"/forget", form)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(answer), "forgot 0 claims of consumer billing for id inv-1") {
		t.Errorf("a forget posted on a new connection: %d\n%s", resp.StatusCode, answer)
	}
}
