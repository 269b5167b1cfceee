// Package tlstest makes throw-away certificate authorities and
// certificates for tests that turn TLS on for real: a CA, a server
// certificate for 127.0.0.1 and localhost signed by it, a client
// certificate for mutual TLS, and a second, unrelated CA to show that a
// wrong CA is refused. Everything is written as PEM files into a directory
// the caller owns, because servers (PostgreSQL, RabbitMQ, MariaDB) and
// drivers (sslrootcert=, cacertfile=) take file paths.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files are the paths of one generated set of PEM files.
type Files struct {
	// CA is the certificate of the authority that signed Server and
	// Client: what a client verifies the server against.
	CA string
	// OtherCA is an unrelated authority's certificate: verifying the
	// server against it must fail.
	OtherCA string
	// ServerCert and ServerKey are the server's certificate (valid for
	// 127.0.0.1, ::1 and localhost, nothing else) and its private key.
	ServerCert, ServerKey string
	// ClientCert and ClientKey are a client certificate (common name
	// "idemq-client") and key for mutual TLS.
	ClientCert, ClientKey string
	// Dir is the directory holding them all.
	Dir string
}

// ServerNames are the names and addresses the server certificate is
// valid for; any other name is refused by a verifying client.
var ServerNames = []string{"localhost", "127.0.0.1", "::1"}

// Generate writes a fresh CA, a server and a client certificate signed by
// it, and an unrelated second CA into dir, and returns their paths. Keys
// are ECDSA P-256, written with mode 0600 (PostgreSQL refuses a key that
// others can read); certificates are valid from an hour ago for a day.
func Generate(dir string) (*Files, error) {
	f := &Files{
		Dir:        dir,
		CA:         filepath.Join(dir, "ca.pem"),
		OtherCA:    filepath.Join(dir, "other-ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"),
		ServerKey:  filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"),
		ClientKey:  filepath.Join(dir, "client-key.pem"),
	}
	ca, caKey, err := newCA("idemq test CA")
	if err != nil {
		return nil, err
	}
	other, _, err := newCA("idemq unrelated CA")
	if err != nil {
		return nil, err
	}
	if err := writeCert(f.CA, ca.Raw); err != nil {
		return nil, err
	}
	if err := writeCert(f.OtherCA, other.Raw); err != nil {
		return nil, err
	}
	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if err := issue(server, ca, caKey, f.ServerCert, f.ServerKey); err != nil {
		return nil, err
	}
	client := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "idemq-client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := issue(client, ca, caKey, f.ClientCert, f.ClientKey); err != nil {
		return nil, err
	}
	return f, nil
}

// Chown gives every file to uid:gid, for servers that run as their own
// user (PostgreSQL, RabbitMQ) and insist on owning their key.
func (f *Files) Chown(uid, gid int) error {
	for _, p := range []string{f.Dir, f.CA, f.OtherCA, f.ServerCert, f.ServerKey, f.ClientCert, f.ClientKey} {
		if err := os.Chown(p, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
}

func newCA(name string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("tlstest: CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func issue(tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey, certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	sn, err := serial()
	if err != nil {
		return err
	}
	tmpl.SerialNumber = sn
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("tlstest: %s: %w", tmpl.Subject.CommonName, err)
	}
	if err := writeCert(certPath, der); err != nil {
		return err
	}
	// PKCS#8: read by Go, OpenSSL (PostgreSQL, MariaDB) and Erlang alike.
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
}

func writeCert(path string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}
