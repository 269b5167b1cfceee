package urlparam

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// File is a file a URL parameter names: the parameter, which errors name,
// and the path it gives ("" for none).
type File struct{ Param, Path string }

// TLSConfig returns a client TLS config (TLS 1.2 or later) that verifies
// the server for serverName ("" leaves the name to the client library,
// which checks each host it dials) against the PEM certificates in ca's
// file, or the system's roots when ca names none, and presents the key
// pair in cert's and key's files when they are given, both or neither.
// Its errors name the parameters of scheme's URL, never a file's path: a
// key's path is hidden wherever the URL is shown.
func TLSConfig(scheme, serverName string, ca, cert, key File) (*tls.Config, error) {
	tc := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12}
	if ca.Path != "" {
		pem, err := os.ReadFile(ca.Path)
		if err != nil {
			return nil, fmt.Errorf("%s URL parameter %s: %w", scheme, ca.Param, pathless(err))
		}
		if tc.RootCAs = x509.NewCertPool(); !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s URL parameter %s: no PEM certificate in the file", scheme, ca.Param)
		}
	}
	switch {
	case (cert.Path == "") != (key.Path == ""):
		return nil, fmt.Errorf("%s URL parameters %s and %s go together", scheme, cert.Param, key.Param)
	case cert.Path != "":
		pair, err := tls.LoadX509KeyPair(cert.Path, key.Path)
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			param := cert.Param
			if pe.Path == key.Path {
				param = key.Param
			}
			return nil, fmt.Errorf("%s URL parameter %s: %w", scheme, param, pathless(err))
		} else if err != nil {
			return nil, fmt.Errorf("%s URL parameters %s and %s: %w", scheme, cert.Param, key.Param, err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// pathless is err without the path of the file it is about.
func pathless(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}
