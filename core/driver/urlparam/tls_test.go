package urlparam_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/tlstest"
)

// A config built from the files verifies a real server against the CA and
// presents the client's pair to a server that requires one; a wrong CA or
// name fails the handshake.
func TestTLSConfigHandshakes(t *testing.T) {
	f, err := tlstest.Generate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(f.ServerCert, f.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	pem, _ := os.ReadFile(f.CA)
	clients := x509.NewCertPool()
	clients.AppendCertsFromPEM(pem)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: clients, ClientAuth: tls.RequireAndVerifyClientCert})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	}()
	dial := func(tc *tls.Config) error {
		c, err := tls.Dial("tcp", ln.Addr().String(), tc)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Read(make([]byte, 1)) // the server's verdict on the client's certificate
		if err != nil && strings.Contains(err.Error(), "EOF") {
			err = nil
		}
		return err
	}
	mutual := func(ca, name string) *tls.Config {
		tc, err := urlparam.TLSConfig("x", name, urlparam.File{"ca", ca}, urlparam.File{"cert", f.ClientCert}, urlparam.File{"key", f.ClientKey})
		if err != nil {
			t.Fatal(err)
		}
		return tc
	}
	if err := dial(mutual(f.CA, "localhost")); err != nil {
		t.Fatalf("the right CA, name and client pair: %v", err)
	}
	if err := dial(mutual(f.OtherCA, "localhost")); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("another CA: %v, want unknown authority", err)
	}
	if err := dial(mutual(f.CA, "db.example.com")); err == nil || !strings.Contains(err.Error(), "not db.example.com") {
		t.Errorf("another server name: %v, want a name mismatch", err)
	}
	noPair, err := urlparam.TLSConfig("x", "localhost", urlparam.File{"ca", f.CA}, urlparam.File{"cert", ""}, urlparam.File{"key", ""})
	if err != nil || len(noPair.Certificates) != 0 || noPair.MinVersion != tls.VersionTLS12 {
		t.Fatalf("CA alone: %+v, %v", noPair, err)
	}
	if err := dial(noPair); err == nil {
		t.Error("no client pair against a server requiring one: the handshake passed")
	}
}

// Errors name the parameter the user wrote and never the path it gave.
func TestTLSConfigErrorsNameTheParameter(t *testing.T) {
	f, err := tlstest.Generate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "s3cret-dir", "x.pem")
	cases := []struct {
		ca, cert, key string
		want          string
	}{
		{missing, "", "", "x URL parameter tls_ca: open: no such file"},
		{f.ClientKey, "", "", "x URL parameter tls_ca: no PEM certificate in the file"},
		{"", f.ClientCert, "", "x URL parameters tls_cert and tls_key go together"},
		{"", "", f.ClientKey, "x URL parameters tls_cert and tls_key go together"},
		{"", f.ClientCert, missing, "x URL parameter tls_key: open: no such file"},
		{"", missing, f.ClientKey, "x URL parameter tls_cert: open: no such file"},
		{"", f.ClientCert, f.ServerKey, "x URL parameters tls_cert and tls_key: tls: private key does not match public key"},
	}
	for _, c := range cases {
		_, err := urlparam.TLSConfig("x", "", urlparam.File{"tls_ca", c.ca}, urlparam.File{"tls_cert", c.cert}, urlparam.File{"tls_key", c.key})
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("ca %q cert %q key %q: %v, want %q", c.ca, c.cert, c.key, err, c.want)
		} else if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), f.Dir) {
			t.Errorf("%v shows a path", err)
		}
	}
}
