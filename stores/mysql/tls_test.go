package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/tlstest"
	"github.com/idemq/idemq/stores/mysql"
)

// TestTLSCustomCA connects to a private MariaDB server that requires TLS
// with the URL parameter ssl-ca (a throw-away CA), claims an id over the
// encrypted connection, and shows that a wrong CA, a wrong server name and
// a plaintext connection are refused with errors that say so.
func TestTLSCustomCA(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private MariaDB server; not in -short")
	}
	f := tlstest.Certs(t, "")
	port := tlstest.MariaDB(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := func(host, params string) string {
		return fmt.Sprintf("mysql://root@%s:%d/mysql?table=tls_claims&timeout=5s&%s", host, port, params)
	}
	store, err := core.OpenStore[*sql.Tx](ctx, u("127.0.0.1", "ssl-ca="+f.CA))
	if err != nil {
		t.Fatalf("ssl-ca with the right CA: %v", err)
	}
	s := store.(*mysql.Store)
	defer s.Close()
	var name, cipher string
	if err := s.DB().QueryRowContext(ctx, `SHOW SESSION STATUS LIKE 'Ssl_cipher'`).Scan(&name, &cipher); err != nil {
		t.Fatal(err)
	}
	if cipher == "" {
		t.Fatal("Ssl_cipher is empty: the connection is not encrypted")
	}
	t.Logf("connected with cipher %s, server certificate verified against ssl-ca", cipher)
	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := txn.Claim(ctx, "tls", []driver.Claim{{ID: "m1"}}); err != nil || res[0] != driver.ClaimWon {
		t.Fatalf("claim over TLS: %v %v", res, err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Client certificate and an explicit server name are accepted too.
	if s2, err := core.OpenStore[*sql.Tx](ctx, u("127.0.0.1", fmt.Sprintf("ssl-ca=%s&ssl-cert=%s&ssl-key=%s&ssl-server-name=localhost", f.CA, f.ClientCert, f.ClientKey))); err != nil {
		t.Errorf("with a client certificate: %v", err)
	} else {
		s2.(*mysql.Store).Close()
	}

	refused := []struct{ name, url, want string }{
		{"wrong CA", u("127.0.0.1", "ssl-ca="+f.OtherCA), "certificate signed by unknown authority"},
		{"wrong server name", u("127.0.0.1", "ssl-ca="+f.CA+"&ssl-server-name=db.example.com"), "certificate is valid for localhost, not db.example.com"},
		{"tls=true verifies the URL's host against the system roots", u("127.0.0.1", "tls=true"), "certificate signed by unknown authority"},
		// MariaDB 10.11 answers a plaintext login under
		// require_secure_transport with "Access denied".
		{"plaintext", u("127.0.0.1", "tls=false"), "Access denied"},
		{"ssl-ca with skip-verify", u("127.0.0.1", "ssl-ca="+f.CA+"&tls=skip-verify"), "contradicts ssl-ca"},
	}
	for _, c := range refused {
		s, err := core.OpenStore[*sql.Tx](ctx, c.url)
		if err == nil {
			s.(*mysql.Store).Close()
			t.Errorf("%s: connected; want a refusal", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not say %q", c.name, err, c.want)
			continue
		}
		t.Logf("%s: refused: %v", c.name, err)
	}
}

// TestTLSServerNameFromURLHost: with tls=true the driver would verify the
// placeholder address of its parameter parsing (127.0.0.1) instead of the
// URL's host; ParseDSN puts the URL's host back.
func TestTLSServerNameFromURLHost(t *testing.T) {
	c, err := mysql.ParseDSN("mysql://u:p@db.example.com:3306/app?tls=true")
	if err != nil {
		t.Fatal(err)
	}
	if c.TLS == nil || c.TLS.ServerName != "db.example.com" {
		t.Fatalf("TLS server name %v; want db.example.com", c.TLS)
	}
	c, err = mysql.ParseDSN("mysql://u:p@db.example.com/app?tls=skip-verify")
	if err != nil || c.TLS == nil || !c.TLS.InsecureSkipVerify {
		t.Fatalf("skip-verify: %v %v", c, err)
	}
	if _, err := mysql.ParseDSN("mysql://u:p@db.example.com/app?ssl-cert=/x.pem"); err == nil || !strings.Contains(err.Error(), "ssl-ca") {
		t.Errorf("ssl-cert without ssl-ca: %v; want an error naming ssl-ca", err)
	}
	if _, err := mysql.ParseDSN("mysql://u:s3cretpw@db.example.com:bad/app"); err == nil || strings.Contains(err.Error(), "s3cretpw") {
		t.Errorf("unparseable URL: %v; want an error without the password", err)
	}
}
