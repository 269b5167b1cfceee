package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/idemq/idemq/brokers/kafka"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/internal/tlstest"
)

// TestSASLOverTLS runs kfake (bench/cmd/kfake, servicetest.StartKfake)
// with TLS (a throw-away CA's server certificate and key files) and SASL
// (a SCRAM-SHA-512 and a PLAIN user), then
// publishes and consumes through the adapter with a kafka-go Dialer that
// verifies the server and authenticates with kafka-go's own sasl/scram
// and sasl/plain mechanisms. A wrong password, no SASL at all, a wrong CA
// and a plaintext client are refused.
func TestSASLOverTLS(t *testing.T) {
	f := tlstest.Certs(t, "")
	const topic = "sasl-topic"
	addr := servicetest.StartKfake(t, "-brokers", "1", "-auto-create=false", "-min-session-timeout", "100ms",
		"-tls-cert", f.ServerCert, "-tls-key", f.ServerKey,
		"-sasl", "SCRAM-SHA-512:scram-user:scram-S3cret",
		"-sasl", "PLAIN:plain-user:plain-S3cret",
		"-topics", topic+","+topic+".dlq")
	tlsFor := func(caFile string) *tls.Config {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	scramMech, err := scram.Mechanism(scram.SHA512, "scram-user", "scram-S3cret")
	if err != nil {
		t.Fatal(err)
	}
	dialer := func(m sasl.Mechanism, caFile string) *kafkago.Dialer {
		return &kafkago.Dialer{Timeout: 5 * time.Second, DualStack: true, TLS: tlsFor(caFile), SASLMechanism: m}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, mech := range []sasl.Mechanism{scramMech, plain.Mechanism{Username: "plain-user", Password: "plain-S3cret"}} {
		t.Run(mech.Name(), func(t *testing.T) {
			d := dialer(mech, f.CA)
			pub, err := kafka.NewPublisher(ctx, addr, kafka.WithTopic(topic), kafka.WithDialer(d))
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			id := "sasl-" + mech.Name()
			if err := core.NewPublisher(pub).Publish(ctx, "", &core.Message{ID: id, Body: []byte("over TLS and SASL")}); err != nil {
				t.Fatalf("publish: %v", err)
			}
			src, err := kafka.Open(ctx, addr, kafka.WithTopic(topic), kafka.WithGroup("g-"+mech.Name()), kafka.WithDialer(d),
				kafka.WithStartOffset(kafkago.FirstOffset))
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer src.Close()
			for {
				dl, err := src.Receive(ctx)
				if err != nil {
					t.Fatalf("receive: %v", err)
				}
				m := dl.Message()
				dl.Ack(ctx)
				if m.ID == id {
					break
				}
			}
		})
	}

	wrongPass, _ := scram.Mechanism(scram.SHA512, "scram-user", "wrong")
	refused := []struct {
		name string
		d    *kafkago.Dialer
		want string
	}{
		// kfake drops the connection on a failed SASL exchange, and
		// kafka-go reports that as "unexpected EOF".
		{"wrong password", dialer(wrongPass, f.CA), "EOF"},
		{"TLS without SASL", dialer(nil, f.CA), "EOF"},
		{"wrong CA", dialer(scramMech, f.OtherCA), "certificate signed by unknown authority"},
		{"plaintext", &kafkago.Dialer{Timeout: 2 * time.Second, SASLMechanism: scramMech}, "EOF"},
	}
	for _, r := range refused {
		short, cancelShort := context.WithTimeout(ctx, 10*time.Second)
		_, err := kafka.Open(short, addr, kafka.WithTopic(topic), kafka.WithGroup("g-bad"), kafka.WithDialer(r.d))
		cancelShort()
		if err == nil {
			t.Errorf("%s: opened; want a refusal", r.name)
			continue
		}
		if !strings.Contains(err.Error(), r.want) {
			t.Errorf("%s: %v; want it to say %q", r.name, err, r.want)
			continue
		}
		if strings.Contains(err.Error(), "S3cret") {
			t.Errorf("%s: error shows the password: %v", r.name, err)
		}
		t.Logf("%s: refused: %v", r.name, err)
	}
}
