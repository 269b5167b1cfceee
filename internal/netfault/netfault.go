// Package netfault puts faults between a test's client and a real service
// on loopback: a Toxiproxy server (github.com/Shopify/toxiproxy/v2, built
// from the bench module, where it is a tool, so that the library's module
// never requires it) whose proxies delay, throttle, reset or swallow the
// traffic (toxics), or take the link down, while the client uses them.
package netfault

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/servicetest"
)

// ServerPackage is the Toxiproxy server's main package, built from the
// bench module.
const ServerPackage = "github.com/Shopify/toxiproxy/v2/cmd/server"

// Toxiproxy is a running Toxiproxy server, reached through its HTTP API.
type Toxiproxy struct {
	api string // http://host:port
}

// Start builds and starts a Toxiproxy server with its API on a free
// loopback port, stopped when t ends. When it cannot be built (no go
// command, no bench module) t ends through servicetest.Unavailable.
func Start(t testing.TB) *Toxiproxy {
	t.Helper()
	bin, err := servicetest.BenchBinary("toxiproxy-server", ServerPackage)
	if err != nil {
		servicetest.Unavailable(t, "no Toxiproxy server for the network faults: %v", err)
	}
	port := fmt.Sprint(servicetest.FreePort(t))
	cmd := exec.Command(bin, "-host", "127.0.0.1", "-port", port)
	setParentDeath(cmd)
	var out servicetest.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the Toxiproxy server: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	x := &Toxiproxy{api: "http://127.0.0.1:" + port}
	servicetest.WaitFor(t, 30*time.Second, "the Toxiproxy API on port "+port, func() bool {
		select {
		case <-done:
			t.Fatalf("the Toxiproxy server ended: %s", lastLines(out.String()))
		default:
		}
		resp, err := http.Get(x.api + "/version")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return x
}

func lastLines(s string) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return strings.Join(lines[max(0, len(lines)-10):], "\n")
}

// Proxy is one link through the Toxiproxy server: clients connect to
// Listen and reach the upstream service.
type Proxy struct {
	Name, Listen, Upstream string
	x                      *Toxiproxy
}

// Attributes are a toxic's settings, as Toxiproxy documents them per type
// (latency: latency, jitter in ms; bandwidth: rate in KB/s; reset_peer and
// timeout: timeout in ms).
type Attributes map[string]any

// Proxy starts a proxy named name on a free loopback port in front of
// upstream, a loopback host:port: a fault is never aimed elsewhere.
func (x *Toxiproxy) Proxy(t testing.TB, name, upstream string) *Proxy {
	t.Helper()
	return x.ProxyAt(t, name, "127.0.0.1:0", upstream)
}

// ProxyAt is Proxy listening on listen, for a service that must know its
// proxy's address before it starts (a Kafka broker advertising it).
func (x *Toxiproxy) ProxyAt(t testing.TB, name, listen, upstream string) *Proxy {
	t.Helper()
	host, _, err := net.SplitHostPort(upstream)
	if err != nil {
		t.Fatalf("netfault: upstream %q: %v", upstream, err)
	}
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" {
		t.Fatalf("netfault: upstream %q is not a loopback address", upstream)
	}
	var p struct{ Listen string }
	if err := x.call(http.MethodPost, "/proxies", map[string]any{
		"name": name, "listen": listen, "upstream": upstream, "enabled": true,
	}, &p); err != nil {
		t.Fatalf("netfault: proxy %s → %s: %v", name, upstream, err)
	}
	return &Proxy{Name: name, Listen: p.Listen, Upstream: upstream, x: x}
}

// AddToxic adds a toxic named name of type typ ("latency", "bandwidth",
// "reset_peer", "timeout", …) on stream: "downstream" is what the client
// receives, "upstream" what it sends.
func (p *Proxy) AddToxic(name, typ, stream string, attrs Attributes) error {
	return p.x.call(http.MethodPost, "/proxies/"+p.Name+"/toxics", map[string]any{
		"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs,
	}, nil)
}

// RemoveToxic removes the toxic named name.
func (p *Proxy) RemoveToxic(name string) error {
	return p.x.call(http.MethodDelete, "/proxies/"+p.Name+"/toxics/"+name, nil, nil)
}

// Disable takes the link down: open connections are cut and new ones
// refused until Enable.
func (p *Proxy) Disable() error { return p.setEnabled(false) }

// Enable brings the link back up.
func (p *Proxy) Enable() error { return p.setEnabled(true) }

func (p *Proxy) setEnabled(on bool) error {
	return p.x.call(http.MethodPost, "/proxies/"+p.Name, map[string]any{"enabled": on}, nil)
}

// call sends one API request with body as JSON and decodes the answer
// into out.
func (x *Toxiproxy) call(method, path string, body, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, x.api+path, r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("toxiproxy %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}
