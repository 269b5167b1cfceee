package webhook

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/sqlite"
)

// A webhook:// URL opened with core.OpenSource serves the Source on its
// own server, which the Consumer's shutdown closes; secrets rotate by
// lines of the secret file.
func TestOpenByURLEndToEnd(t *testing.T) {
	dir := t.TempDir()
	park := filepath.Join(dir, "parked")
	os.Mkdir(park, 0o700)
	secrets := filepath.Join(dir, "stripe.secret")
	if err := os.WriteFile(secrets, []byte("whsec_old_one\r\n\n"+stripeSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, err := core.OpenSource(ctx, "webhook://127.0.0.1:0/hooks/stripe?verify=stripe&secret_file="+secrets+"&park_dir="+park+"&wait=2s&max_body=4096&tolerance=1m")
	if err != nil {
		t.Fatal(err)
	}
	addr := src.(*Source).Addr().String()
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	store.DB().Exec(`CREATE TABLE effects (id TEXT NOT NULL, body TEXT NOT NULL)`)
	c, err := core.New(src, store, effect, core.WithName("payments"))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()

	url := "http://" + addr + "/hooks/stripe"
	body := `{"id":"evt_1","type":"invoice.paid"}`
	mustStatus(t, send(stripeRequest(t, url, body)), http.StatusOK)
	mustStatus(t, send(stripeRequest(t, url, body)), http.StatusOK)
	var n int
	store.DB().QueryRow(`SELECT count(*) FROM effects WHERE id = 'evt_1'`).Scan(&n)
	if n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	mustStatus(t, send(stripeRequest(t, "http://"+addr+"/elsewhere", body)), http.StatusNotFound)

	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return")
	}
	if a := send(stripeRequest(t, url, body)); a.err == nil {
		t.Fatalf("the server still answers after Close: %d", a.status)
	}
}

// A bad URL fails Open naming the parameter, never showing a value.
func TestOpenByURLErrors(t *testing.T) {
	dir := t.TempDir()
	secrets := filepath.Join(dir, "secret")
	os.WriteFile(secrets, []byte("s3cr3t\n"), 0o600)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n\n"), 0o600)
	t.Setenv("WEBHOOK_TEST_SECRET", "s3cr3t")
	ok := "verify=github&secret_file=" + secrets + "&park_dir=" + dir
	for q, want := range map[string]string{
		"secret_file=" + secrets + "&park_dir=" + dir:                          "webhook URL parameter verify: required",
		"verify=s3cr3t&secret_file=" + secrets + "&park_dir=" + dir:            "webhook URL parameter verify: not github, shopify, standard or stripe",
		"verify=github&park_dir=" + dir:                                        "secret_file and secret_env: give exactly one",
		ok + "&secret_env=WEBHOOK_TEST_SECRET":                                 "secret_file and secret_env: give exactly one",
		"verify=github&secret_file=/nonexistent/s3cr3t&park_dir=" + dir:        "webhook URL parameter secret_file: open",
		"verify=github&secret_file=" + empty + "&park_dir=" + dir:              "webhook URL parameter secret_file: no secret",
		"verify=github&secret_env=WEBHOOK_TEST_UNSET&park_dir=" + dir:          "webhook URL parameter secret_env: no secret",
		"verify=standard&secret_env=WEBHOOK_TEST_SECRET&park_dir=" + dir:       "webhook URL parameter secret_env: signature: standard: secret 1 of 1 has neither",
		"verify=github&secret_file=" + secrets:                                 "webhook URL parameter park_dir: required",
		"verify=github&secret_file=" + secrets + "&park_dir=/nonexistent/park": "webhook URL parameter park_dir: stat",
		"verify=github&secret_file=" + secrets + "&park_dir=" + secrets:        "webhook URL parameter park_dir: not a directory",
		ok + "&tolerance=1m":     "webhook URL parameter tolerance: GitHub sends no timestamp",
		ok + "&tolerance=s3cr3t": "webhook URL parameter tolerance: not a positive duration",
		ok + "&max_body=0":       "webhook URL parameter max_body: 0 must be positive",
		ok + "&wait=s3cr3t":      "webhook URL parameter wait: not a duration",
		ok + "&answer_by=0s":     "webhook URL parameter answer_by: 0s must be positive",
		ok + "&horizon=s3cr3t":   "webhook URL parameter horizon: not a duration",
		ok + "&park_dri=x":       `unknown parameter "park_dri" (did you mean park_dir?)`,
	} {
		src, err := Open(context.Background(), "webhook://127.0.0.1:0/hook?"+q)
		if err == nil {
			src.Close()
		}
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: %v, want %q and no value", q, err, want)
		}
	}
	for _, raw := range []string{"webhook://127.0.0.1/hook?" + ok, "webhook://u:s3cr3t@127.0.0.1:0/hook?" + ok, "webhook:///hook?" + ok, "amqp://127.0.0.1:0/hook?" + ok} {
		src, err := Open(context.Background(), raw)
		if err == nil {
			src.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "a host and a port") || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: %v", raw, err)
		}
	}
	// Through core, the error names the parameter too.
	if _, err := core.OpenSource(context.Background(), "webhook://127.0.0.1:0/hook?verify=github&secret_file="+secrets); err == nil || !strings.Contains(err.Error(), "webhook URL parameter park_dir: required") {
		t.Errorf("OpenSource: %v", err)
	}
	// A webhook registers no publisher: the provider sends the requests.
	if _, err := core.OpenPublisher(context.Background(), "webhook://127.0.0.1:0/hook?"+ok); err == nil || !strings.Contains(err.Error(), `registered for scheme "webhook"`) {
		t.Errorf("OpenPublisher: %v, want no publisher registered for the scheme", err)
	}
}

// A Source that Open serves answers the requests its Consumer gives back
// at Close, then stops the server.
func TestOpenedCloseAnswersHandedOut(t *testing.T) {
	dir := t.TempDir()
	secrets := filepath.Join(dir, "secret")
	os.WriteFile(secrets, []byte(ghSecret+"\n"), 0o600)
	src, err := Open(context.Background(), "webhook://127.0.0.1:0/gh?verify=github&secret_file="+secrets+"&park_dir="+dir+"&wait=100ms")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + src.Addr().String() + "/gh"
	r := brokertest.StartReceiver(t, src, 0)
	a := make(chan answer, 1)
	go func() { a <- send(githubRequest(t, url, "o-1", "body")) }()
	d, err := r.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	got := <-a
	mustStatus(t, got, http.StatusServiceUnavailable)
	if got.retryAfter != "1" {
		t.Errorf("Retry-After %q, want 1", got.retryAfter)
	}
	if err := d.Ack(context.Background()); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Errorf("Ack after Close: %v, want ErrStaleDelivery", err)
	}
	if a := send(githubRequest(t, url, "o-2", "body")); a.err == nil {
		t.Errorf("the server still answers after Close: %d", a.status)
	}
}

// A park directory that is missing or not a directory fails start-up
// naming the path, in code, by URL and for the dead-letter tools: it is
// no secret, and the operator must know which directory to create.
func TestParkDirErrorsNameThePath(t *testing.T) {
	dir := t.TempDir()
	secrets := filepath.Join(dir, "secret")
	os.WriteFile(secrets, []byte("s3cr3t\n"), 0o600)
	missing := filepath.Join(dir, "parked")
	profile, err := signature.GitHub([]string{"s3cr3t"})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{missing, secrets} {
		_, err := NewSource(WithProfile(profile), WithParkDir(bad))
		if err == nil || !strings.Contains(err.Error(), "WithParkDir") || !strings.Contains(err.Error(), bad) {
			t.Errorf("NewSource with park dir %s: %v", bad, err)
		}
		src, err := Open(context.Background(), "webhook://127.0.0.1:0/hook?verify=github&secret_file="+secrets+"&park_dir="+bad)
		if err == nil {
			src.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "webhook URL parameter park_dir") || !strings.Contains(err.Error(), bad) {
			t.Errorf("Open with park_dir=%s: %v", bad, err)
		}
		if _, err := admin.OpenDeadLetters(context.Background(), "webhook://127.0.0.1:0/hook?park_dir="+bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("OpenDeadLetters with park_dir=%s: %v", bad, err)
		}
	}
}
