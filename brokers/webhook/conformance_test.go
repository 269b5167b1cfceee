package webhook

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

// The push conformance suite over a Source on the Standard Webhooks
// profile, mounted in a loopback server, and over one core.OpenSource
// opened by URL, serving itself; the suite sends signed requests as a
// provider does and reads the park directory through
// admin.OpenDeadLetters.
func TestConformance(t *testing.T) {
	for name, open := range map[string]func(t *testing.T, dir string) (driver.Source, string){
		"Mounted": mountedSource,
		"ByURL":   sourceByURL,
	} {
		t.Run(name, func(t *testing.T) {
			brokertest.RunPush(t, brokertest.PushHarness{
				RecordsCause:        true,
				OperatesDeadLetters: true,
				Quiet:               300 * time.Millisecond,
				Open: func(t *testing.T) *brokertest.PushFixture {
					return conformanceFixture(t, open)
				},
			})
		})
	}
}

// conformanceWait is the sources' WithWait: a request is held longer
// than the suite's quiet period before it is answered busy.
const conformanceWait = 2 * time.Second

// mountedSource is a Source at /hooks/standard of an httptest server,
// parking in dir; it returns the endpoint.
func mountedSource(t *testing.T, dir string) (driver.Source, string) {
	p, err := signature.StandardWebhooks([]string{stdSecret})
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(WithProfile(p), WithParkDir(dir), WithWait(conformanceWait))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/hooks/standard", src)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return src, srv.URL + "/hooks/standard"
}

// sourceByURL is a Source core.OpenSource opens on a free loopback port,
// parking in dir; it returns the endpoint.
func sourceByURL(t *testing.T, dir string) (driver.Source, string) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(stdSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := core.OpenSource(context.Background(), "webhook://127.0.0.1:0/hooks/standard?verify=standard&secret_file="+
		url.QueryEscape(secret)+"&park_dir="+url.QueryEscape(dir)+"&wait="+conformanceWait.String())
	if err != nil {
		t.Fatal(err)
	}
	return src, "http://" + src.(*Source).Addr().String() + "/hooks/standard"
}

// conformanceFixture is a fresh Source from open, parking in a directory
// of its own.
func conformanceFixture(t *testing.T, open func(t *testing.T, dir string) (driver.Source, string)) *brokertest.PushFixture {
	dir := t.TempDir()
	src, endpoint := open(t, dir)
	sourceURL := "webhook://127.0.0.1:0/hooks/standard?verify=standard&secret_env=IDEMQ_CONFORMANCE_UNUSED&park_dir=" + url.QueryEscape(dir)
	return &brokertest.PushFixture{
		Source:    src,
		SourceURL: sourceURL,
		Send: func(ctx context.Context, m *driver.Message) (brokertest.Answer, error) {
			r := standardRequest(t, endpoint, m.ID, time.Now(), string(m.Body)).WithContext(ctx)
			for k, v := range m.Headers {
				r.Header.Set(k, v)
			}
			return sendAnswer(r)
		},
		DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
			q, err := admin.OpenDeadLetters(ctx, sourceURL)
			if err != nil {
				return nil, err
			}
			defer q.Close()
			var out []brokertest.DeadLetter
			err = q.Scan(ctx, func(p *admin.Parked) error {
				out = append(out, brokertest.DeadLetter{ID: p.ID, Body: p.Body, Cause: p.Cause})
				return nil
			})
			return out, err
		},
	}
}

// sendAnswer sends r and reads the reply as a provider does: a 2xx
// accepts the event, anything else asks for it again after Retry-After.
func sendAnswer(r *http.Request) (brokertest.Answer, error) {
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return brokertest.Answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return brokertest.Answer{}, err
	}
	a := brokertest.Answer{
		Accepted: resp.StatusCode >= 200 && resp.StatusCode < 300,
		Detail:   fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body))),
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		n, err := strconv.Atoi(ra)
		if err != nil {
			return a, fmt.Errorf("Retry-After %q is not a number of seconds", ra)
		}
		a.RetryAfter = time.Duration(n) * time.Second
		a.Detail += " (Retry-After " + ra + ")"
	}
	return a, nil
}
