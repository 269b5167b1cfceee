package redis

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/tlstest"
)

// startTLS starts a private server that speaks TLS only, with the default
// user off and the ACL user alice (password s3cret); clientAuth is
// --tls-auth-clients (yes: mutual TLS).
func startTLS(t *testing.T, clientAuth string) (*server, *tlstest.Files) {
	t.Helper()
	files, err := tlstest.Generate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := newRedis(t, "--tls-port", "--port", "0",
		"--tls-cert-file", files.ServerCert, "--tls-key-file", files.ServerKey, "--tls-ca-cert-file", files.CA, "--tls-auth-clients", clientAuth,
		"--user", "default", "off", "--user", "alice", "on", ">s3cret", "~*", "&*", "+@all")
	srv.start()
	return srv, files
}

// Over rediss:// with an ACL user from the URL, a Consumer opened by URL
// applies what a Publisher opened by URL sends, and its dead letters list;
// a wrong password, an unknown CA, a plain redis:// URL and a missing
// client certificate are refused, and no error shows the password.
func TestTLSAndACLUser(t *testing.T) {
	srv, files := startTLS(t, "optional")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := "rediss://alice:s3cret@" + srv.addr() + "/secure?group=g&min_idle=1s&poll=50ms&tls_ca=" + url.QueryEscape(files.CA)
	pub, err := core.OpenPublisher(ctx, base)
	if err != nil {
		t.Fatalf("OpenPublisher: %v", err)
	}
	defer pub.Close()
	src, err := core.OpenSource(ctx, base)
	if err != nil {
		t.Fatalf("OpenSource: %v", err)
	}
	e := brokertest.NewEffects(t)
	c, stop := run(t, e, src, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if m.ID == "tls-bad" {
			return core.Permanent(fmt.Errorf("refused"))
		}
		return e.Apply(ctx, tx, m)
	})
	for _, id := range []string{"tls-1", "tls-2", "tls-bad"} {
		if err := pub.Publish(ctx, "", &core.Message{ID: id, Body: []byte(id)}); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	waitFor(t, 10*time.Second, "2 processed, 1 parked", func() bool { st := c.Stats(); return st.Processed == 2 && st.DeadLettered == 1 })
	stop()
	if counts := e.Counts(t); counts["tls-1"] != 1 || counts["tls-2"] != 1 {
		t.Errorf("effects %v", counts)
	}
	q, err := admin.OpenDeadLetters(ctx, base)
	if err != nil {
		t.Fatalf("OpenDeadLetters: %v", err)
	}
	defer q.Close()
	var parked []string
	q.Scan(ctx, func(p *admin.Parked) error { parked = append(parked, p.ID); return nil })
	if len(parked) != 1 || parked[0] != "tls-bad" {
		t.Errorf("parked %v, want [tls-bad]", parked)
	}

	for name, u := range map[string]string{
		"wrong password": strings.Replace(base, "s3cret", "n0tThePassword", 1),
		"unknown CA":     strings.Replace(base, url.QueryEscape(files.CA), url.QueryEscape(files.OtherCA), 1),
		"no TLS":         "redis://alice:n0tThePassword@" + srv.addr() + "/secure?group=g",
	} {
		src, err := core.OpenSource(ctx, u)
		if err == nil {
			src.Close()
			t.Errorf("%s: opened", name)
			continue
		}
		if strings.Contains(err.Error(), "n0tThePassword") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", name, err)
		}
		t.Logf("%s: %v", name, err)
	}

	mtls, files2 := startTLS(t, "yes")
	mbase := "rediss://alice:s3cret@" + mtls.addr() + "/secure?group=g&tls_ca=" + url.QueryEscape(files2.CA)
	if src, err := core.OpenSource(ctx, mbase); err == nil {
		src.Close()
		t.Error("mutual TLS: opened without a client certificate")
	}
	src, err = core.OpenSource(ctx, mbase+"&tls_cert="+url.QueryEscape(files2.ClientCert)+"&tls_key="+url.QueryEscape(files2.ClientKey))
	if err != nil {
		t.Fatalf("mutual TLS with tls_cert and tls_key: %v", err)
	}
	src.Close()
}

// A Publisher and a DeadLetters opened by URL check every parameter as the
// Source does.
func TestURLOpenersShareOneTable(t *testing.T) {
	ctx := context.Background()
	u := RedisURL(t) + "/s?group=g&min_idle=1ms"
	for what, open := range map[string]func() error{
		"source":    func() error { _, err := core.OpenSource(ctx, u); return err },
		"publisher": func() error { _, err := core.OpenPublisher(ctx, u); return err },
		"dlq":       func() error { _, err := admin.OpenDeadLetters(ctx, u); return err },
	} {
		if err := open(); err == nil || !strings.Contains(err.Error(), "redis URL parameter min_idle") {
			t.Errorf("%s: %v, want the min_idle parameter named", what, err)
		}
	}
	var _ driver.Source = (*Source)(nil)
}
