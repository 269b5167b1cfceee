package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
)

// URLs are read into an address, a stream and options; a wrong one fails
// naming the parameter, never quoting a value or the password.
func TestParseURL(t *testing.T) {
	addr, stream, opts, err := parseURL("redis://alice:pw@cache.local/orders:v1?group=billing&consumer=b1&start=$&id_field=order_id&body_field=payload&min_idle=5s&max_extension=10m&poll=20ms&dlq=orders:parked&max_age=48h")
	if err != nil {
		t.Fatal(err)
	}
	c, err := resolve(stream, true, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if addr != "cache.local:6379" || stream != "orders:v1" || c.user != "alice" || c.pass != "pw" || c.group != "billing" || c.consumer != "b1" ||
		c.start != "$" || c.idField != "order_id" || c.bodyField != "payload" || c.minIdle.String() != "5s" || c.maxExtension.String() != "10m0s" ||
		c.poll.String() != "20ms" || c.dlq != "orders:parked" || c.maxAge.String() != "48h0m0s" || c.tls != nil {
		t.Errorf("parsed %s %s %+v", addr, stream, c)
	}
	for raw, want := range map[string]string{
		"redis://h/s?group=g&min_idel=1s":          `unknown parameter "min_idel" (did you mean min_idle?)`,
		"redis://h/s?group=g&window=7":             `unknown parameter "window"`, // the Consumer's WithWindow is the window
		"redis://h/s?group=g&min_idle=s3cr3t":      "redis URL parameter min_idle: not a duration",
		"redis://h/s?group=g&start=":               "redis URL parameter start: empty",
		"redis://h/s?group=g&tls_ca=/s3cr3t":       "need a rediss:// URL",
		"rediss://h/s?group=g&tls_cert=/s3cr3t":    "tls_cert and tls_key go together",
		"rediss://h/s?group=g&tls_ca=/nonexistent": "redis URL parameter tls_ca",
		"redis://h?group=g":                        "the stream as its path",
	} {
		_, _, _, err := parseURL(raw)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: %v, want %q and no value", raw, err, want)
		}
	}
}

// Option errors of a source opened by URL name the URL parameter; the
// checks that span options name both; the password never shows.
func TestOpenByURLErrors(t *testing.T) {
	ctx := context.Background()
	for raw, want := range map[string]string{
		"redis://h/s?min_idle=1s":                  "a consumer group is required",
		"redis://h/s?group=g&poll=1ms":             "redis URL parameter poll",
		"redis://h/s?group=g&max_len=9&max_age=1h": "max_len (WithMaxLen) and max_age (WithMaxAge) exclude each other",
		"redis://h/s?group=g&dlq=s":                "the dead-letter stream is the stream itself",
		"redis://h/s?group=g&body_field=idemq-id":  "the id field \"idemq-id\" (id_field=, WithIDField), the body field \"idemq-id\" (body_field=, WithBodyField) and the key field \"idemq-key\" must differ",
		"redis://u:s3cr3t@127.0.0.1:1/s?group=g":   "connecting to 127.0.0.1:1",
	} {
		src, err := core.OpenSource(ctx, raw)
		if err == nil {
			src.Close()
		}
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: %v, want %q", raw, err, want)
		}
	}
}

// Options given in code apply after the URL's parameters, and their
// errors name the option.
func TestCodeOptionsAfterURL(t *testing.T) {
	_, stream, fromURL, err := parseURL("redis://h/s?group=g&poll=70ms")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := resolve(stream, true, fromURL, []Option{WithPoll(90 * time.Millisecond)}); err != nil || c.poll != 90*time.Millisecond {
		t.Errorf("poll %v, %v; want the code's 90ms", c.poll, err)
	}
	if _, err := resolve(stream, true, fromURL, []Option{WithPoll(0)}); err == nil || !strings.Contains(err.Error(), "WithPoll") || strings.Contains(err.Error(), "URL parameter") {
		t.Errorf("code option error %v, want WithPoll named", err)
	}
}
