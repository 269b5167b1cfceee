package rabbitmq

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/tlstest"
)

// TestTLS adds a TLS listener that requires a client certificate to the
// local RabbitMQ node, then publishes and consumes over amqps:// with the
// server verified against a throw-away CA and a client certificate sent,
// all from URL parameters. A wrong CA, a wrong server name and a missing
// client certificate are refused with errors that say so.
func TestTLS(t *testing.T) {
	amqpURL(t) // the node must be up
	f := tlstest.Certs(t, "rabbitmq")
	port := tlstest.RabbitMQListener(t, f, true)
	queue := uniqueQueue(t, amqpURL(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tlsURL := func(host, params string) string {
		return fmt.Sprintf("amqps://guest:guest@%s:%d/?queue=%s&%s", host, port, queue, params)
	}
	good := fmt.Sprintf("cacertfile=%s&certfile=%s&keyfile=%s", f.CA, f.ClientCert, f.ClientKey)

	src, err := core.OpenSource(ctx, tlsURL("127.0.0.1", good))
	if err != nil {
		t.Fatalf("amqps with the right CA and a client certificate: %v", err)
	}
	defer src.Close()
	pub, err := core.OpenPublisher(ctx, tlsURL("localhost", good+"&server_name_indication=localhost"))
	if err != nil {
		t.Fatalf("publisher over amqps: %v", err)
	}
	defer pub.Close()
	if err := pub.Publish(ctx, "", &core.Message{ID: "tls-1", Body: []byte("over TLS")}); err != nil {
		t.Fatal(err)
	}
	d, err := brokertest.StartReceiver(t, src, 0).Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m := d.Message(); m.ID != "tls-1" || string(m.Body) != "over TLS" {
		t.Fatalf("received %q %q", m.ID, m.Body)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	// Settled over TLS: nothing is left in the queue.
	if n := queueDepth(t, amqpURL(t), queue); n != 0 {
		t.Errorf("queue depth %d after the ack", n)
	}

	refused := []struct{ name, url, want string }{
		{"wrong CA", tlsURL("127.0.0.1", fmt.Sprintf("cacertfile=%s&certfile=%s&keyfile=%s", f.OtherCA, f.ClientCert, f.ClientKey)),
			"certificate signed by unknown authority"},
		{"wrong server name", tlsURL("127.0.0.1", good+"&server_name_indication=mq.example.com"),
			"certificate is valid for localhost, not mq.example.com"},
		// TLS 1.3 sends the server's "certificate required" alert after
		// the client thinks the handshake is done: the client reads the
		// alert, finds the connection reset, or finds it closed during the
		// AMQP handshake (reading: EOF; writing: broken pipe, or "use of
		// closed network connection" when amqp091-go's reader closed it
		// first). Any of them is a refusal; only the first says why.
		{"no client certificate", tlsURL("127.0.0.1", "cacertfile="+f.CA),
			"certificate required|connection reset by peer|channel/connection is not open|EOF|broken pipe|use of closed network connection"},
	}
	for _, c := range refused {
		s, err := core.OpenSource(ctx, c.url)
		if err == nil {
			s.Close()
			t.Errorf("%s: connected; want a refusal", c.name)
			continue
		}
		if !containsAny(err.Error(), strings.Split(c.want, "|")) {
			t.Errorf("%s: error %q does not say %q", c.name, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "guest:guest") {
			t.Errorf("%s: error shows the password: %v", c.name, err)
		}
		t.Logf("%s: refused: %v", c.name, err)
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
