package rabbitmq

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

func TestParseSourceURL(t *testing.T) {
	u, q, opts, err := parseSourceURL("amqp://guest:guest@127.0.0.1:5672/vh?queue=payments&queue_type=quorum&retry=queue&dead_letter=reject&declare=false&dead_letter_queue=p.dead&retry_queue=p.later&connection_name=svc&exchange=payments.in&id_header=MessageId&heartbeat=5")
	if err != nil {
		t.Fatal(err)
	}
	if q != "payments" {
		t.Errorf("queue = %q", q)
	}
	if u != "amqp://guest:guest@127.0.0.1:5672/vh?heartbeat=5" {
		t.Errorf("amqp url = %q: idemq parameters must go, amqp ones stay", u)
	}
	cfg := defaultConfig(q)
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.queueType != Quorum || cfg.retryMode != RetryViaQueue || cfg.deadLetterMode != DeadLetterReject ||
		cfg.declare || cfg.deadLetterQueue != "p.dead" || cfg.retryQueue != "p.later" || cfg.connName != "svc" ||
		cfg.exchange != "payments.in" || cfg.idHeader != "MessageId" {
		t.Errorf("config from URL = %+v", cfg)
	}
	for raw, want := range map[string]string{
		"amqp://h/?queue=q&bogus=1":          "bogus",
		"amqp://h/":                          "queue",
		"amqp://h/?queue=q&retry=later":      "retry",
		"amqp://h/?queue=q&dead_letter=drop": "dead_letter",
		"amqp://h/?queue=q&declare=maybe":    "declare",
		"amqp://h/?queue=q&prefetch=x":       "prefetch",
		"amqp://h/?queue=q&prefetch=50":      "prefetch", // the Consumer's window is the prefetch
		"amqp://h/?queue=a&queue=b":          "queue",
		"kafka://h/?queue=q":                 "scheme",
	} {
		if _, _, _, err := parseSourceURL(raw); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseSourceURL(%q) = %v, want an error naming %s", raw, err, want)
		}
	}
	if _, err := Open(context.Background(), "amqp://h/"); err == nil || !strings.Contains(err.Error(), "queue=") || !strings.Contains(err.Error(), "WithQueue") {
		t.Errorf("Open without a queue: %v, want an error naming queue= and WithQueue", err)
	}
	// A bad value reaches the option, which names itself.
	if _, err := Open(context.Background(), "amqp://h/?queue=q&delivery_limit=-1"); err == nil || !strings.Contains(err.Error(), "WithDeliveryLimit") {
		t.Errorf("OpenURL with delivery_limit=-1: %v", err)
	}
}

func TestOpenURLConsumes(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	ctx := context.Background()
	src, err := Open(ctx, url+"?queue="+q+"&queue_type=quorum")
	if err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, src, 7)
	if src.Queue() != q || src.cfg.queueType != Quorum || src.window != 7 {
		t.Fatalf("source from URL: queue %q type %q window %d", src.Queue(), src.cfg.queueType, src.window)
	}
	publishN(t, url, q, "url", 2)
	for _, d := range receiveN(t, r, 2, 10*time.Second) {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// One URL with exchange= opens both sides: the Source declares the exchange
// and binds its queue to it with the queue's name, the Publisher sends
// there with that routing key. An exchange that exists with another type
// (topic) is kept, and bound to all the same.
func TestOneURLWithExchange(t *testing.T) {
	url := amqpURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, kind := range []string{"", "topic"} {
		q := uniqueQueue(t, url)
		exchange := q + "-exchange"
		t.Cleanup(func() { deleteExchangeIfUnused(url, exchange) })
		if kind != "" {
			declareExchange(t, url, exchange, kind)
		}
		u := strings.TrimSuffix(url, "/") + "/?queue=" + q + "&exchange=" + exchange
		src, err := core.OpenSource(ctx, u)
		if err != nil {
			t.Fatalf("OpenSource with exchange (pre-declared %q): %v", kind, err)
		}
		defer src.Close()
		pub, err := core.OpenPublisher(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		if err := pub.Publish(ctx, "", &core.Message{ID: "via-" + exchange, Body: []byte("x")}); err != nil {
			t.Fatalf("Publish to exchange (pre-declared %q): %v", kind, err)
		}
		d, err := brokertest.StartReceiver(t, src, 0).Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		if m := d.Message(); m.ID != "via-"+exchange || driver.MetadataOf(m.Metadata)["messaging.destination.name"] != exchange {
			t.Errorf("received %q from %q, want via-%s from the exchange", m.ID, driver.MetadataOf(m.Metadata)["messaging.destination.name"], exchange)
		}
	}
	// With declare=false the exchange must exist.
	q := uniqueQueue(t, url)
	if src, err := Open(ctx, url+"?queue="+q+"&exchange="+q+"-missing"); err != nil {
		t.Fatal(err)
	} else {
		src.Close()
		deleteExchangeIfUnused(url, q+"-missing")
	}
	if _, err := Open(ctx, url+"?queue="+q+"&declare=false&exchange="+q+"-absent"); err == nil || !strings.Contains(err.Error(), "exchange") {
		t.Errorf("declare=false with an absent exchange: %v, want an error naming the exchange", err)
	}
}

func declareExchange(t *testing.T, url, name, kind string) {
	t.Helper()
	ch := testChannel(t, url)
	if err := ch.ExchangeDeclare(name, kind, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
}

func TestMultiNodeURL(t *testing.T) {
	ns, err := splitNodes("amqps://u:p%2Cw@h1:5671,h2,[::1]:5673/vh?heartbeat=5")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"amqps://u:p%2Cw@h1:5671/vh?heartbeat=5", "amqps://u:p%2Cw@h2/vh?heartbeat=5", "amqps://u:p%2Cw@[::1]:5673/vh?heartbeat=5"}
	if strings.Join(ns.URLs, " ") != strings.Join(want, " ") {
		t.Errorf("node urls = %q, want %q", ns.URLs, want)
	}
	// idemq parameters go, the host list stays.
	u, q, _, err := parseSourceURL("amqp://guest:guest@127.0.0.1:5672,127.0.0.1:5673/vh?queue=payments&queue_type=quorum&heartbeat=5")
	if err != nil || q != "payments" || u != "amqp://guest:guest@127.0.0.1:5672,127.0.0.1:5673/vh?heartbeat=5" {
		t.Errorf("parseSourceURL = %q, %q, %v", u, q, err)
	}
	for raw, want := range map[string]string{
		"amqp://u:secret@h1:5672,,h3/?queue=q":       "node 2 of 3: empty host",
		"amqp://u:secret@h1:5672,h2:56x2/?queue=q":   `node 2 of 2: "h2:56x2": port "56x2" is not a number`,
		"amqp://u:secret@h1:5672,h2:99999/?queue=q":  `port "99999" is not a number in 1..65535`,
		"amqp://u:secret@h1:5672,:5673/?queue=q":     `node 2 of 2: ":5673": empty host`,
		"amqp://u:secret@h1:5672,h2:/?queue=q":       `"h2:": port "" is not a number`,
		"amqp://u:sec,ret/x@h1:5672,h2/?queue=q":     "node 1 of 2: not a host:port (not shown",
		"amqps://u:secret@h1:5672,[::1/?queue=q":     `no ']'`,
		"amqp://u:secret@h1:5672,h2:5673/?queue=q&x": "x",
	} {
		_, err := Open(context.Background(), raw)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v, want an error with %q", raw, err, want)
			continue
		}
		for _, secret := range []string{"secret", "sec,ret"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Open(%q) error shows the password: %v", raw, err)
			}
		}
	}
	if _, err := NewPublisher(context.Background(), "amqp://u:secret@h1,,h2/"); err == nil || !strings.Contains(err.Error(), "empty host") {
		t.Errorf("NewPublisher with an empty node: %v", err)
	}
}

// A node list through core.OpenSource and core.OpenPublisher, with an IPv6
// literal and a node without a port before the last (forms net/url alone
// refuses): the dead nodes are skipped and the live one used.
func TestCoreOpensNodeList(t *testing.T) {
	live := servicetest.RabbitMQURL(t)
	u, err := url.Parse(live)
	if err != nil {
		t.Fatal(err)
	}
	hp := u.Host
	if u.Port() == "" {
		hp += ":5672"
	}
	u.Host = "[::1]:1,127.0.0.1:1," + hp
	q := uniqueQueue(t, live)
	ctx := context.Background()
	src, err := core.OpenSource(ctx, u.String()+"?queue="+q)
	if err != nil {
		t.Fatalf("core.OpenSource with a node list: %v", err)
	}
	defer src.Close()
	pub, err := core.OpenPublisher(ctx, u.String()+"?queue="+q)
	if err != nil {
		t.Fatalf("core.OpenPublisher with a node list: %v", err)
	}
	defer pub.Close()
	if err := pub.Publish(ctx, q, &core.Message{ID: "n1", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d, err := brokertest.StartReceiver(t, src, 0).Receive(rctx)
	if err != nil || d.Message().ID != "n1" {
		t.Fatalf("receive through the node list: %v", err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
