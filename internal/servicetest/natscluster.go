package servicetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSCluster is a private JetStream cluster on loopback: n nats-servers,
// each with its own name, store directory, client port and route port,
// routed to every other. It goes when the test ends.
type NATSCluster struct {
	// Servers are the cluster's servers; Servers[i].URL reaches server i.
	Servers []*NATSServer
	// URL lists every server's URL, comma-separated, as clients that fail
	// over take it.
	URL string
}

// StartNATSCluster starts an n-server JetStream cluster and waits until
// every server takes part in JetStream. Without the
// binary the test skips, or fails when IDEMQ_REQUIRE_SERVICES=1.
func StartNATSCluster(t testing.TB, n int) *NATSCluster {
	t.Helper()
	routes := make([]string, n)
	ports := make([]int, n)
	for i := range n {
		ports[i] = FreePort(t)
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", ports[i])
	}
	c := &NATSCluster{}
	var urls []string
	for i := range n {
		s := newNATS(t, fmt.Sprintf("server_name: n%d\ncluster {\n  name: idemq-test\n  listen: 127.0.0.1:%d\n  routes: [%s]\n}\n",
			i, ports[i], strings.Join(routes, ", ")))
		c.Servers = append(c.Servers, s)
		urls = append(urls, s.URL)
	}
	c.URL = strings.Join(urls, ",")
	for _, s := range c.Servers {
		s.Start()
	}
	c.WaitReady(time.Minute)
	return c
}

// WaitReady waits until every server of the cluster takes part in
// JetStream: a stream with one replica per server can be placed.
func (c *NATSCluster) WaitReady(timeout time.Duration) {
	t := c.Servers[0].t
	t.Helper()
	var last error
	WaitFor(t, timeout, "every JetStream server to join the cluster", func() bool {
		last = c.probe(len(c.Servers))
		return last == nil
	})
}

// probe creates and deletes a stream of n replicas.
func (c *NATSCluster) probe(n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nc, err := natsgo.Connect(c.URL, natsgo.Timeout(2*time.Second), natsgo.NoReconnect())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IDEMQ_PROBE", Subjects: []string{"idemq.probe"}, Replicas: n, Storage: jetstream.MemoryStorage}); err != nil {
		return err
	}
	return js.DeleteStream(ctx, "IDEMQ_PROBE")
}
