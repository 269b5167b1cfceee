// Package netfault puts faults between a test's client and a real service
// on loopback: a Toxiproxy server in the test's own process, whose proxies
// delay, throttle, cut or swallow the traffic (toxics) while the client
// uses them. It is a package of its own so that only the tests that inject
// network faults carry Toxiproxy's modules.
package netfault

import (
	"net"
	"net/http"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	toxiclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/rs/zerolog"

	"github.com/idemq/idemq/internal/servicetest"
)

// Toxiproxy is a Toxiproxy server running in the test's own process: TCP
// proxies on loopback ports in front of real services, whose traffic the
// test delays, throttles, cuts or swallows (toxics) while a client uses
// them.
type Toxiproxy struct {
	client *toxiclient.Client
}

// Start starts a Toxiproxy server with its API on a free loopback
// port, shut down when t ends.
func Start(t testing.TB) *Toxiproxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	// Some toxics log through zerolog's global logger: keep test output
	// to what the test says.
	zerolog.SetGlobalLevel(zerolog.Disabled)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	go srv.Listen(addr)
	t.Cleanup(func() {
		srv.Collection.Clear()
		srv.Shutdown()
	})
	servicetest.WaitFor(t, 10*time.Second, "the Toxiproxy API on "+addr, func() bool {
		resp, err := http.Get("http://" + addr + "/version")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	return &Toxiproxy{client: toxiclient.NewClient(addr)}
}

// Proxy starts a proxy named name on a free loopback port in front of
// upstream (a loopback host:port: a fault is never aimed elsewhere) and
// returns it; clients connect to its Listen address. Its toxics are added
// and removed with AddToxic and RemoveToxic, and Disable/Enable take the
// whole link down (connections refused and cut) and back up.
func (x *Toxiproxy) Proxy(t testing.TB, name, upstream string) *toxiclient.Proxy {
	t.Helper()
	host, _, err := net.SplitHostPort(upstream)
	if err != nil {
		t.Fatalf("toxiproxy upstream %q: %v", upstream, err)
	}
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" {
		t.Fatalf("toxiproxy upstream %q is not a loopback address", upstream)
	}
	p, err := x.client.CreateProxy(name, "127.0.0.1:0", upstream)
	if err != nil {
		t.Fatalf("toxiproxy: create proxy %s → %s: %v", name, upstream, err)
	}
	return p
}
