package nats

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/internal/tlstest"
)

// securityMode is one way a private server is secured: its configuration,
// the URL parts (user info, parameters) that get in, and ones that do not.
type securityMode struct {
	name   string
	config string
	good   func(u string) string // u is nats://127.0.0.1:PORT/STREAM?consumer=w&subject=…
	bad    func(u string) string
	secret string // must never show in an error
}

// withUser puts userinfo into u.
func withUser(u, userinfo string) string {
	return strings.Replace(u, "nats://", "nats://"+userinfo+"@", 1)
}

func securityModes(t *testing.T) []securityMode {
	dir := t.TempDir()
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	seedFile := filepath.Join(dir, "user.nk")
	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	otherFile := filepath.Join(dir, "other.nk")
	for f, b := range map[string][]byte{seedFile: seed, otherFile: otherSeed} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	certs := tlstest.Certs(t, "")
	tlsParams := func(ca string) string {
		return "&tls_ca=" + url.QueryEscape(ca) + "&tls_cert=" + url.QueryEscape(certs.ClientCert) + "&tls_key=" + url.QueryEscape(certs.ClientKey)
	}
	return []securityMode{
		{
			name:   "password",
			config: `authorization { users = [ { user: alice, password: "pw-S3cret-9" } ] }`,
			good:   func(u string) string { return withUser(u, "alice:pw-S3cret-9") },
			bad:    func(u string) string { return withUser(u, "alice:pw-Wrong-7") },
			secret: "pw-Wrong-7",
		},
		{
			name:   "token",
			config: `authorization { token: "tok-S3cret-9" }`,
			good:   func(u string) string { return u + "&token=tok-S3cret-9" },
			bad:    func(u string) string { return u + "&token=tok-Wrong-7" },
			secret: "tok-Wrong-7",
		},
		{
			name:   "nkey",
			config: fmt.Sprintf(`authorization { users = [ { nkey: %s } ] }`, pub),
			good:   func(u string) string { return u + "&nkey_seed=" + url.QueryEscape(seedFile) },
			bad:    func(u string) string { return u + "&nkey_seed=" + url.QueryEscape(otherFile) },
			secret: string(otherSeed),
		},
		{
			name: "mutual-tls",
			config: fmt.Sprintf(`tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }`,
				certs.ServerCert, certs.ServerKey, certs.CA),
			good: func(u string) string { return u + tlsParams(certs.CA) },
			bad:  func(u string) string { return u + tlsParams(certs.OtherCA) },
		},
		credsMode(t, dir),
	}
}

// TestSecurity runs the adapter against a private server per security
// mode: the right credentials consume and publish, wrong ones fail at open
// with an error that shows no secret.
func TestSecurity(t *testing.T) {
	for _, m := range securityModes(t) {
		t.Run(m.name, func(t *testing.T) {
			srv := servicetest.StartNATS(t, m.config)
			ctx := ctxFor(t, 30*time.Second)
			stream := "SEC_" + strings.ToUpper(randomHex(4))
			base := srv.URL + "/" + stream + "?consumer=w&subject=sec." + randomHex(4)

			_, err := core.OpenSource(ctx, m.bad(base))
			if err == nil {
				t.Fatal("opened with wrong credentials")
			}
			if m.secret != "" && strings.Contains(err.Error(), m.secret) {
				t.Errorf("the error shows the secret: %v", err)
			}
			if !strings.Contains(err.Error(), "nats: connecting") {
				t.Errorf("the error does not say connecting failed: %v", err)
			}
			t.Logf("wrong credentials: %v", err)

			src, err := core.OpenSource(ctx, m.good(base))
			if err != nil {
				t.Fatalf("OpenSource: %v", err)
			}
			defer src.Close()
			pub, err := core.OpenPublisher(ctx, m.good(base))
			if err != nil {
				t.Fatalf("OpenPublisher: %v", err)
			}
			defer pub.Close()
			if err := pub.Publish(ctx, "", &core.Message{ID: "sec-1", Body: []byte("hi")}); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			d, err := brokertest.StartReceiver(t, src, 0).Receive(ctx)
			if err != nil {
				t.Fatalf("Receive: %v", err)
			}
			if d.Message().ID != "sec-1" {
				t.Fatalf("received %q", d.Message().ID)
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			q, err := admin.OpenDeadLetters(context.Background(), m.good(base))
			if err != nil {
				t.Fatalf("OpenDeadLetters: %v", err)
			}
			q.Close()
		})
	}
}
