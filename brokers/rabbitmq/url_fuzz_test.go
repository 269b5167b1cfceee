package rabbitmq

import (
	"net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/redact/redacttest"
)

// FuzzParseSourceURL: parseSourceURL never panics, never quotes the
// password in an error, and when it accepts a URL, the queue is set and
// the URL for amqp091-go keeps the credentials and drops idemq's own
// parameters.
func FuzzParseSourceURL(f *testing.F) {
	for _, s := range []string{
		"amqp://guest:guest@127.0.0.1:5672/?queue=payments",
		"amqps://u:p%40ss@mq.example.com/vh?queue=q&queue_type=quorum&delivery_limit=5&cacertfile=/ca.pem&certfile=/c.pem&keyfile=/k.pem&server_name_indication=mq",
		"amqp://u:secret@h/?queue=q&retry=queue&dead_letter=reject&declare=false&prefetch=10&connection_name=c",
		"amqp://u:secret@h:notaport/?queue=q", "amqp://u:secret@h1:5672,h2,[::1]:5674/vh?queue=q&heartbeat=3",
		"amqp://u:se,cr/et@h1,h2/?queue=q", "amqp://u:secret@h1:5672,,h2/?queue=q", "amqp://h/?queue=q&queue=r", "amqp://h/?queue=q&bogus=1", "http://h/?queue=q",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		redacttest.NoSecret(t, raw, func(raw string) error {
			amqpURL, queue, opts, err := parseSourceURL(raw)
			if err != nil {
				return err
			}
			_, _, err = sourceConfig(amqpURL, queue, opts)
			return err
		})
		amqpURL, queue, _, err := parseSourceURL(raw)
		if err != nil {
			return
		}
		if queue == "" {
			t.Fatalf("accepted %q without a queue", raw)
		}
		ns, err := splitNodes(amqpURL)
		if err != nil {
			t.Fatalf("amqp URL %q of %q does not split into nodes: %v", amqpURL, raw, err)
		}
		u, err := url.Parse(ns.URLs[0])
		if err != nil {
			t.Fatalf("amqp URL %q of %q does not parse: %v", amqpURL, raw, err)
		}
		for _, k := range []string{"queue", "queue_type", "retry", "prefetch", "delivery_limit"} {
			if u.Query().Has(k) {
				t.Fatalf("idemq parameter %s passed on to amqp091-go: %q", k, amqpURL)
			}
		}
		rawNodes, _ := splitNodes(raw)
		in, _ := url.Parse(rawNodes.URLs[0])
		if in.User.String() != u.User.String() {
			t.Fatalf("credentials changed: %q → %q", in.User, u.User)
		}
	})
}

// FuzzToMessage is the id extraction of this adapter: the business id is
// the AMQP message_id exactly as sent, headers of every AMQP type render
// to strings one for one, and forged attempt headers never give an
// attempt below 1.
func FuzzToMessage(f *testing.F) {
	f.Add("pay-1", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", int64(3), []byte("raw"), uint8(2), false)
	f.Add("a\x00b", driver.AttemptHeader, "-9223372036854775808", int64(-1), []byte{0xff}, uint8(40), true)
	f.Add("", "x-delivery-count", "x", int64(9223372036854775807), []byte(nil), uint8(0), true)
	f.Fuzz(func(t *testing.T, id, key, s string, n int64, b []byte, depth uint8, redelivered bool) {
		var nested any = s
		for range depth % 40 {
			nested = amqp.Table{"n": nested}
		}
		h := amqp.Table{
			key:                  s,
			"n":                  n,
			"b":                  b,
			"t":                  time.Unix(n%1e10, 0),
			"arr":                []any{s, n, b, nil},
			"nested":             nested,
			"x-delivery-count":   n,
			driver.AttemptHeader: s,
		}
		d := &amqp.Delivery{MessageId: id, Headers: h, Body: b, Redelivered: redelivered}
		var m driver.Message
		toMessage(&m, "q", "", d)
		if m.ID != id {
			t.Fatalf("id %q became %q", id, m.ID)
		}
		if len(m.Headers) != len(h) {
			t.Fatalf("%d headers rendered from %d", len(m.Headers), len(h))
		}
		if m.Attempt < 1 {
			t.Fatalf("attempt %d from headers %v", m.Attempt, h)
		}
	})
}
