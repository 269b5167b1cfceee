package nats

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/redact/redacttest"
)

// parse reads raw as core.OpenSource would.
func parse(raw string) (string, config, error) {
	c, err := resolve(raw, false, []Option(nil))
	return c.stream, c, err
}

// TestParseURL: every parameter reaches its setting, and the defaults
// hold for the ones not given.
func TestParseURL(t *testing.T) {
	stream, c, err := parse("nats://u:p@h1:4222,h2:4223/ORDERS?consumer=billing&subject=orders.%3E&declare=false&id_header=order-id" +
		"&ack_wait=10s&heartbeat=false&max_extension=5m&replicas=3&dlq_stream=PARKED&dlq_subject=parked.billing")
	if err != nil {
		t.Fatal(err)
	}
	if stream != "ORDERS" || c.consumer != "billing" || c.subject != "orders.>" || c.declare || c.idHeader != "order-id" ||
		c.ackWait != 10*time.Second || c.heartbeat || c.maxExtension != 5*time.Minute || c.replicas != 3 ||
		c.dlqStream != "PARKED" || c.dlqSubject != "parked.billing" || strings.Join(c.servers, ",") != "nats://h1:4222,nats://h2:4223" {
		t.Fatalf("parsed %s %+v", stream, c)
	}
	_, c, err = parse("nats://h/ORDERS?consumer=billing")
	if err != nil {
		t.Fatal(err)
	}
	if c.subject != "ORDERS" || !c.declare || c.idHeader != DefaultIDHeader || c.ackWait != 6*time.Second || !c.heartbeat ||
		c.maxExtension != time.Hour || c.dlqStream != "ORDERS_DLQ" || c.dlqSubject != "idemq.dlq.ORDERS.billing" {
		t.Fatalf("defaults %+v", c)
	}
	// Options given in code override the URL's, and their errors name the option.
	c, err = resolve("nats://h/ORDERS?consumer=billing&ack_wait=7s", false, []Option{WithConsumer("audit"), WithAckWait(9 * time.Second)})
	if err != nil || c.consumer != "audit" || c.ackWait != 9*time.Second || c.dlqSubject != "idemq.dlq.ORDERS.audit" {
		t.Fatalf("overridden %+v, %v", c, err)
	}
	if _, err := resolve("nats://h/ORDERS?ack_wait=7s", false, []Option{WithAckWait(0)}); err == nil || !strings.Contains(err.Error(), "option WithAckWait") {
		t.Fatalf("a bad option: %v", err)
	}
}

// FuzzParseURL: parsing never panics and quotes no secret (password,
// token, seed file) in an error.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"nats://u:p%40ss@127.0.0.1:4222/ORDERS?consumer=w&subject=orders.created",
		"nats://h1:4222,h2:4222/S?consumer=w&token=s3cret&tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem",
		"nats://h/S?consumer=w&nkey_seed=/seed&creds=/x.creds&replicas=0&ack_wait=x",
		"nats://tok@h/S", "nats://h/", "nats://h/S?consumer=a.b", "nats://h/S?dlq_subject=a.*",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		redacttest.NoSecret(t, raw, func(raw string) error {
			_, _, err := parse(raw)
			return err
		})
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		if stream, _, err := parse(raw); err == nil && stream != strings.Trim(u.Path, "/") {
			t.Fatalf("%q: stream %q", raw, stream)
		}
	})
}
