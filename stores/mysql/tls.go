package mysql

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"

	"github.com/idemq/idemq/internal/redact"
)

// tlsParams are the mysql:// URL parameters that build a verifying TLS
// config without code, named as the mysql client's options.
var tlsParams = []string{"ssl-ca", "ssl-cert", "ssl-key", "ssl-server-name"}

// tlsFromURL builds the TLS config that u's ssl-ca, ssl-cert, ssl-key and
// ssl-server-name parameters ask for (nil when none is given) and returns
// the query without them, for the driver. ssl-ca turns TLS on with the
// server's certificate verified against that CA file and its name against
// ssl-server-name (default: the URL's host); ssl-cert and ssl-key add a
// client certificate.
func tlsFromURL(u *url.URL) (*tls.Config, string, error) {
	q, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, "", fmt.Errorf("mysql URL parameters: %w", err)
	}
	given := map[string]string{}
	for _, k := range tlsParams {
		if q.Has(k) {
			given[k] = q.Get(k)
			q.Del(k)
		}
	}
	if len(given) == 0 {
		return nil, u.RawQuery, nil
	}
	ca, ok := given["ssl-ca"]
	if !ok {
		return nil, "", fmt.Errorf("mysql URL parameter ssl-ca: required with ssl-cert, ssl-key or ssl-server-name")
	}
	if tv := q.Get("tls"); tv == "skip-verify" || tv == "preferred" || tv == "false" {
		return nil, "", fmt.Errorf("mysql URL parameter tls=%s: contradicts ssl-ca, which verifies the server", tv)
	}
	q.Del("tls")
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, "", fmt.Errorf("mysql URL parameter ssl-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, "", fmt.Errorf("mysql URL parameter ssl-ca: no PEM certificate in %s", ca)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	if name := given["ssl-server-name"]; name != "" {
		cfg.ServerName = name
	}
	certFile, keyFile := given["ssl-cert"], given["ssl-key"]
	if (certFile == "") != (keyFile == "") {
		return nil, "", fmt.Errorf("mysql URL parameters ssl-cert and ssl-key: give both or neither")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			// Name the parameter rather than the file: a key's path is
			// hidden wherever the URL is shown.
			var pe *fs.PathError
			switch {
			case errors.As(err, &pe) && pe.Path == keyFile:
				return nil, "", fmt.Errorf("mysql URL parameter ssl-key: %s: %w", pe.Op, pe.Err)
			case errors.As(err, &pe):
				return nil, "", fmt.Errorf("mysql URL parameter ssl-cert: %s: %w", pe.Op, pe.Err)
			}
			return nil, "", fmt.Errorf("mysql URL parameters ssl-cert, ssl-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, q.Encode(), nil
}
