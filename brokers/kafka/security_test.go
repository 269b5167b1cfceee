package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/idemq/idemq/brokers/brokertest"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/internal/tlstest"
)

// secureCluster starts kfake serving TLS only and requiring SASL, with a
// SCRAM-SHA-256, a SCRAM-SHA-512 and a PLAIN user, and creates a topic of
// two partitions on it. It returns the brokers, the certificates and the
// topic.
func secureCluster(t *testing.T, scramPass, plainPass string) (string, *tlstest.Files, string) {
	t.Helper()
	if os.Getenv(servicetest.KafkaEnv) != "" {
		t.Skip("starts its own kfake with TLS and SASL; not run against " + servicetest.KafkaEnv)
	}
	certs := tlstest.Certs(t, "")
	bs := servicetest.StartKfake(t, "-brokers", "1", "-auto-create=false", "-min-session-timeout", "100ms",
		"-tls-cert", certs.ServerCert, "-tls-key", certs.ServerKey,
		"-sasl", "SCRAM-SHA-256:alice:"+scramPass, "-sasl", "SCRAM-SHA-512:carol:"+scramPass, "-sasl", "PLAIN:bob:"+plainPass)
	topic := "idemq-sec-" + randomHex(4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := adminClient(t, bs, kgo.DialTLSConfig(caConfig(t, certs.CA)), kgo.SASL(scram.Auth{User: "alice", Pass: scramPass}.AsSha256Mechanism()))
	if _, err := adm.CreateTopic(ctx, 2, 1, nil, topic); err != nil {
		t.Fatalf("create %s: %v", topic, err)
	}
	return bs, certs, topic
}

func caConfig(t *testing.T, caFile string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// roundTrip publishes one message with pub and receives it with src, and
// dead-letters it (a write to the dead-letter topic Open created, through
// the same TLS and SASL).
func roundTrip(t *testing.T, pub driver.Publisher, src driver.Source) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id := "sec-" + randomHex(4)
	if err := pub.Publish(ctx, "", &driver.Message{ID: id, Body: []byte("b")}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	r := brokertest.StartReceiver(t, src, 0)
	var d *brokertest.Delivery
	for d == nil || d.Message().ID != id { // an earlier subtest's messages come first: ack them
		if d != nil {
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var err error
		if d, err = r.Receive(ctx); err != nil {
			if ctx.Err() != nil {
				t.Fatalf("Receive: %v", err)
			}
			d = nil
		}
	}
	if err := d.DeadLetter(ctx, errors.New("parked over TLS")); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
}

// TLS and SASL from the URL (tls=true, ca_file, cert_file, key_file,
// sasl= with the URL's user and password) for the Source and the
// Publisher: the right credentials work, a wrong password, a wrong CA and
// a missing sasl= fail with an error that says so and never quotes the
// password.
func TestSecurityFromURL(t *testing.T) {
	pass, plainPass := "scramS3cret-"+randomHex(4), "plainS3cret-"+randomHex(4)
	bs, certs, topic := secureCluster(t, pass, plainPass)
	ctx := context.Background()
	tlsQuery := "tls=true&ca_file=" + url.QueryEscape(certs.CA) + "&cert_file=" + url.QueryEscape(certs.ClientCert) + "&key_file=" + url.QueryEscape(certs.ClientKey)
	srcURL := func(user, pw, mech string) string {
		return fmt.Sprintf("kafka://%s:%s@%s/%s?group=g-%s&session_timeout=2s&heartbeat_interval=50ms&rebalance_timeout=4s&revoke_timeout=1s&%s&sasl=%s",
			user, url.QueryEscape(pw), bs, topic, randomHex(4), tlsQuery, mech)
	}
	pubURL := func(user, pw, mech string) string {
		return fmt.Sprintf("kafka://%s:%s@%s/%s?%s&sasl=%s", user, url.QueryEscape(pw), bs, topic, tlsQuery, mech)
	}
	for _, c := range []struct{ user, pw, mech string }{
		{"alice", pass, "scram-sha-256"}, {"carol", pass, "SCRAM-SHA-512"}, {"bob", plainPass, "plain"},
	} {
		t.Run(c.mech, func(t *testing.T) {
			src, err := core.OpenSource(ctx, srcURL(c.user, c.pw, c.mech))
			if err != nil {
				t.Fatalf("OpenSource: %v", err)
			}
			defer src.Close()
			pub, err := core.OpenPublisher(ctx, pubURL(c.user, c.pw, c.mech))
			if err != nil {
				t.Fatalf("OpenPublisher: %v", err)
			}
			defer pub.Close()
			roundTrip(t, pub.Driver(), src)
		})
	}

	wrong := "wrongS3cret-" + randomHex(4)
	short, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var errs []error
	_, err := core.OpenSource(short, srcURL("alice", wrong, "scram-sha-256"))
	if err == nil || !strings.Contains(err.Error(), "SASL") {
		t.Errorf("OpenSource with a wrong password: %v, want a SASL authentication error", err)
	}
	errs = append(errs, err)
	pub, err := core.OpenPublisher(short, pubURL("bob", wrong, "plain"))
	if err != nil {
		t.Fatalf("OpenPublisher (which connects on Publish): %v", err)
	}
	err = pub.Publish(short, "", &core.Message{ID: "x", Body: []byte("x")})
	pub.Close()
	if err == nil || !strings.Contains(err.Error(), "SASL") {
		t.Errorf("Publish with a wrong password: %v, want a SASL authentication error", err)
	}
	errs = append(errs, err)
	otherCA := strings.Replace(srcURL("alice", pass, "scram-sha-256"), url.QueryEscape(certs.CA), url.QueryEscape(certs.OtherCA), 1)
	_, err = core.OpenSource(short, otherCA)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("OpenSource verifying the brokers against another CA: %v, want a certificate error", err)
	}
	errs = append(errs, err)
	noSASL := strings.Replace(srcURL("alice", pass, "scram-sha-256"), "&sasl=scram-sha-256", "", 1)
	_, err = core.OpenSource(short, noSASL)
	if err == nil || !strings.Contains(err.Error(), "sasl") {
		t.Errorf("OpenSource with a password and no sasl=: %v, want an error naming sasl", err)
	}
	errs = append(errs, err)
	_, err = core.OpenSource(short, fmt.Sprintf("kafka://%s/%s?group=g&sasl=plain", bs, topic))
	if err == nil || !strings.Contains(err.Error(), "user name and password") {
		t.Errorf("OpenSource with sasl= and no user: %v, want an error asking for them", err)
	}
	for _, err := range errs {
		t.Logf("error: %v", err)
		for _, secret := range []string{pass, wrong, plainPass} {
			if err != nil && strings.Contains(err.Error(), secret) {
				t.Errorf("error quotes a password: %v", err)
			}
		}
	}
}

// WithTLS and WithSASL do the same for Sources and Publishers built in
// code.
func TestSecurityOptions(t *testing.T) {
	pass, plainPass := "scramS3cret-"+randomHex(4), "plainS3cret-"+randomHex(4)
	bs, certs, topic := secureCluster(t, pass, plainPass)
	tc := caConfig(t, certs.CA)
	m := scram.Auth{User: "carol", Pass: pass}.AsSha512Mechanism()
	opts := []PublisherOption{WithTopic(topic), WithTLS(tc), WithSASL(m)}
	src, err := Open(context.Background(), bs, append(fastGroup(t), WithGroup("g-"+randomHex(4)), opts[0], opts[1], opts[2])...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer src.Close()
	pub, err := NewPublisher(context.Background(), bs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	roundTrip(t, pub, src)

	// A wrong PLAIN password fails the Publisher and the Source.
	bad := []PublisherOption{WithTopic(topic), WithTLS(tc), WithSASL(plain.Auth{User: "bob", Pass: "wrong"}.AsMechanism())}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bp, err := NewPublisher(context.Background(), bs, bad...)
	if err != nil {
		t.Fatal(err)
	}
	defer bp.Close()
	if err := bp.Publish(ctx, "", &driver.Message{ID: "x", Body: []byte("x")}); err == nil || !strings.Contains(err.Error(), "SASL") {
		t.Errorf("Publish with a wrong password: %v, want a SASL authentication error", err)
	}
	if _, err := Open(ctx, bs, bad[0], bad[1], bad[2], WithGroup("g")); err == nil || !strings.Contains(err.Error(), "SASL") {
		t.Errorf("Open with a wrong password: %v, want a SASL authentication error", err)
	}
	// Without TLS the TLS-only brokers are not reachable.
	if _, err := Open(ctx, bs, WithTopic(topic), WithGroup("g"), WithSASL(m)); err == nil {
		t.Error("Open without TLS succeeded against TLS-only brokers")
	}
	for _, o := range []PublisherOption{WithTLS(nil), WithSASL(nil)} {
		if _, err := NewPublisher(context.Background(), bs, o); err == nil {
			t.Error("a nil WithTLS/WithSASL was accepted")
		}
	}
}
