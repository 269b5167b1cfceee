package kafka

import (
	"net"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/redact/redacttest"
)

// FuzzParseURL: parseTarget (kafka:// URLs and broker lists) never panics,
// quotes no secret in an error, and when it accepts, there is at least one broker and each is a
// host:port.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"kafka://127.0.0.1:9092/payments?group=billing",
		"kafka://b1:9092,b2:9092/t?group=g&id_header=message-id&ordering=key&commit_interval=1s&commit_count=100",
		"b1:9092, b2:9092", "kafka://u:s3cretpw@b1:9092/t?group=g", "kafka://u:s3cretpw@b1:bad/t",
		"kafka://b1:9092/a/b?group=g", "kafka://b1:9092/t?group=g&group=h", "kafka://:9092/t", "",
		"kafka://u:s3cretpw@b1:9092/t?group=g&sasl=scram-sha-512", "kafka://u:s3cret%3Apw@b1:9092/t?sasl=plain&tls=true",
		"kafka://u:s3cretpw@b1:9092/t?sasl=plain&tls=true&ca_file=/nonexistent", "kafka://u@b1:9092/t?sasl=scram-sha-256",
		"kafka+share://u:s3cretpw@b1:9092/t?group=g&sasl=plain&max_extension=1m", "kafka://b1:9092/t?group=g&instance_id=pod-0&group_protocol=consumer",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		redacttest.NoSecret(t, target, func(target string) error {
			cfg := defaultConfig()
			opts, err := parseTarget(target, &cfg, []string{Scheme, ShareScheme})
			for _, o := range opts {
				if err == nil {
					err = o.apply(&cfg)
				}
			}
			return err
		})
		cfg := defaultConfig()
		if _, err := parseTarget(target, &cfg, []string{Scheme, ShareScheme}); err != nil {
			return
		}
		if len(cfg.brokers) == 0 {
			t.Fatalf("accepted %q without brokers", target)
		}
		for _, b := range cfg.brokers {
			if _, _, err := net.SplitHostPort(b); err != nil {
				t.Fatalf("broker %q of %q: %v", b, target, err)
			}
		}
	})
}

// FuzzMessageID is the id extraction of this adapter: the business id is
// the last value of the id header exactly as produced, and every header
// key survives.
func FuzzMessageID(f *testing.F) {
	f.Add("pay-1", "traceparent", []byte("00-x"), []byte("key"), true)
	f.Add("a\x00\xff", "message-id", []byte(""), []byte(nil), false)
	f.Fuzz(func(t *testing.T, id, key string, value, mkey []byte, repeat bool) {
		cfg := defaultConfig()
		hs := []kgo.RecordHeader{{Key: key, Value: value}}
		if repeat {
			hs = append(hs, kgo.RecordHeader{Key: cfg.idHeader, Value: []byte("earlier")})
		}
		hs = append(hs, kgo.RecordHeader{Key: cfg.idHeader, Value: []byte(id)})
		m := new(driver.Message)
		readRecord(&kgo.Record{Topic: "t", Key: mkey, Value: value, Headers: hs}, &cfg, m)
		if m.ID != id {
			t.Fatalf("id %q became %q", id, m.ID)
		}
		if _, ok := m.Headers[key]; !ok {
			t.Fatalf("header %q lost", key)
		}
	})
}
