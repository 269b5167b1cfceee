package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/idemq/idemq/brokers/brokertest"

	"github.com/idemq/idemq/brokers/kafka"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/internal/tlstest"
)

// TestSASLOverTLS runs kfake (bench/cmd/kfake, servicetest.StartKfake)
// with TLS (a throw-away CA's server certificate and key files) and SASL
// (a SCRAM-SHA-512 and a PLAIN user), then
// publishes and consumes through the adapter with WithTLS verifying the
// server and WithSASL authenticating with franz-go's own sasl/scram and
// sasl/plain mechanisms. A wrong password, no SASL at all, a wrong CA and
// a plaintext client are refused.
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
	scramMech := scram.Auth{User: "scram-user", Pass: "scram-S3cret"}.AsSha512Mechanism()
	secure := func(m sasl.Mechanism, caFile string) []kafka.PublisherOption {
		opts := []kafka.PublisherOption{kafka.WithTLS(tlsFor(caFile))}
		if m != nil {
			opts = append(opts, kafka.WithSASL(m))
		}
		return opts
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, mech := range []sasl.Mechanism{scramMech, plain.Auth{User: "plain-user", Pass: "plain-S3cret"}.AsMechanism()} {
		t.Run(mech.Name(), func(t *testing.T) {
			opts := secure(mech, f.CA)
			pub, err := kafka.NewPublisher(ctx, addr, append(opts, kafka.WithTopic(topic))...)
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			id := "sasl-" + mech.Name()
			if err := core.NewPublisher(pub).Publish(ctx, "", &core.Message{ID: id, Body: []byte("over TLS and SASL")}); err != nil {
				t.Fatalf("publish: %v", err)
			}
			src, err := kafka.Open(ctx, addr, kafka.WithTopic(topic), kafka.WithGroup("g-"+mech.Name()), opts[0], opts[1],
				kafka.WithStart(kafka.StartFirst))
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			r := brokertest.StartReceiver(t, src, 0)
			for {
				dl, err := r.Receive(ctx)
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

	wrongPass := scram.Auth{User: "scram-user", Pass: "wrong"}.AsSha512Mechanism()
	refused := []struct {
		name string
		opts []kafka.PublisherOption
		want string
	}{
		// kfake drops the connection on a failed SASL exchange, and
		// franz-go reports that as EOF, or says what is likely missing.
		{"wrong password", secure(wrongPass, f.CA), "EOF"},
		{"TLS without SASL", secure(nil, f.CA), "SASL"},
		{"wrong CA", secure(scramMech, f.OtherCA), "certificate signed by unknown authority"},
		{"plaintext", []kafka.PublisherOption{kafka.WithSASL(scramMech)}, "TLS"},
	}
	for _, r := range refused {
		short, cancelShort := context.WithTimeout(ctx, 10*time.Second)
		opts := []kafka.Option{kafka.WithTopic(topic), kafka.WithGroup("g-bad")}
		for _, o := range r.opts {
			opts = append(opts, o)
		}
		_, err := kafka.Open(short, addr, opts...)
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
