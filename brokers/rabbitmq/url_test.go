package rabbitmq

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestParseSourceURL(t *testing.T) {
	u, q, opts, err := parseSourceURL("amqp://guest:guest@127.0.0.1:5672/vh?queue=payments&queue_type=quorum&retry=queue&dead_letter=reject&declare=false&prefetch=50&dead_letter_queue=p.dead&retry_queue=p.later&connection_name=svc&heartbeat=5")
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
		cfg.declare || cfg.prefetch != 50 || cfg.deadLetterQueue != "p.dead" || cfg.retryQueue != "p.later" || cfg.connName != "svc" {
		t.Errorf("config from URL = %+v", cfg)
	}
	for raw, want := range map[string]string{
		"amqp://h/?queue=q&bogus=1":          "bogus",
		"amqp://h/":                          "queue",
		"amqp://h/?queue=q&retry=later":      "retry",
		"amqp://h/?queue=q&dead_letter=drop": "dead_letter",
		"amqp://h/?queue=q&declare=maybe":    "declare",
		"amqp://h/?queue=q&prefetch=x":       "prefetch",
		"amqp://h/?queue=a&queue=b":          "queue",
		"kafka://h/?queue=q":                 "scheme",
	} {
		if _, _, _, err := parseSourceURL(raw); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseSourceURL(%q) = %v, want an error naming %s", raw, err, want)
		}
	}
	// A bad value reaches the option, which names itself.
	if _, err := OpenURL(context.Background(), "amqp://h/?queue=q&prefetch=0"); err == nil || !strings.Contains(err.Error(), "WithPrefetch") {
		t.Errorf("OpenURL with prefetch=0: %v", err)
	}
}

func TestOpenURLConsumes(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	ctx := context.Background()
	src, err := OpenURL(ctx, url+"?queue="+q+"&queue_type=quorum&prefetch=7")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if src.Queue() != q || src.cfg.queueType != Quorum || src.window != 7 {
		t.Fatalf("source from URL: queue %q type %q window %d", src.Queue(), src.cfg.queueType, src.window)
	}
	publishN(t, url, q, "url", 2)
	for _, d := range receiveN(t, src, 2, 10*time.Second) {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
