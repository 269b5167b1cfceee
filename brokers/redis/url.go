package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/redact"
)

func init() {
	for _, scheme := range []string{"redis", "rediss"} {
		driver.RegisterBroker(scheme, openSourceURL, openPublisherURL)
		admin.RegisterDeadLetters(scheme, openDeadLettersURL)
	}
}

// file is a TLS parameter, read together with the others by tlsConfig.
var file = urlparam.NonEmpty("", func(string) Option { return nil })

// params are the URL parameters of redis:// and rediss:// URLs. Every side
// checks every parameter, so one URL serves the Source, the Publisher and
// DeadLetters.
var params = urlparam.Table[Option]{Scheme: "redis", Params: map[string]urlparam.Param[Option]{
	"group":         urlparam.NonEmpty("WithGroup", WithGroup),
	"consumer":      urlparam.NonEmpty("WithConsumer", WithConsumer),
	"start":         urlparam.Choice("WithStart", map[string]Option{"0": WithStart("0"), "$": WithStart("$")}),
	"id_field":      urlparam.NonEmpty("WithIDField", WithIDField),
	"id_header":     urlparam.NonEmpty("", WithIDField), // the name core's missing-id causes give
	"min_idle":      urlparam.Duration("WithMinIdle", WithMinIdle),
	"max_extension": urlparam.Duration("WithMaxExtension", WithMaxExtension),
	"window":        urlparam.Int("WithWindow", WithWindow),
	"poll":          urlparam.Duration("WithPoll", WithPoll),
	"dlq":           urlparam.NonEmpty("WithDeadLetterStream", WithDeadLetterStream),
	"max_len":       urlparam.Int("WithMaxLen", func(n int) Option { return WithMaxLen(int64(n)) }),
	"max_age":       urlparam.Duration("WithMaxAge", WithMaxAge),
	"db":            urlparam.Int("WithDB", WithDB),
	"tls_ca":        file,
	"tls_cert":      file,
	"tls_key":       file,
}}

// parseURL reads
//
//	redis[s]://[user:pass@]host:6379/STREAM?group=G&consumer=C&…
//
// into the address, the stream and options. A logger in cfg is used as
// WithLogger would be.
func parseURL(u *url.URL, cfg driver.OpenConfig) (addr, stream string, opts []Option, err error) {
	stream = strings.TrimPrefix(u.Path, "/")
	if stream == "" || u.Host == "" {
		return "", "", nil, errors.New("redis URL needs a host and the stream as its path (redis://host:6379/STREAM?group=G)")
	}
	addr = u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "6379")
	}
	if cfg.Logger != nil {
		opts = append(opts, WithLogger(cfg.Logger))
	}
	if u.User != nil {
		pass, _ := u.User.Password()
		opts = append(opts, WithAuth(u.User.Username(), pass))
	}
	q, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return "", "", nil, fmt.Errorf("redis URL parameters: %w", err)
	}
	read, err := params.Read(q)
	if err != nil {
		return "", "", nil, err
	}
	ca, cert, key := q.Get("tls_ca"), q.Get("tls_cert"), q.Get("tls_key")
	switch {
	case u.Scheme != "rediss" && ca+cert+key != "":
		return "", "", nil, errors.New("redis URL parameters tls_ca, tls_cert and tls_key need a rediss:// URL")
	case u.Scheme == "rediss":
		tc, err := tlsConfig(u.Hostname(), ca, cert, key)
		if err != nil {
			return "", "", nil, err
		}
		opts = append(opts, WithTLS(tc))
	}
	return addr, stream, append(opts, read...), nil
}

// tlsConfig verifies the server as host against the system roots or the
// CAs in the file ca, with the client certificate cert and key if given.
func tlsConfig(host, ca, cert, key string) (*tls.Config, error) {
	tc := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("redis URL parameter tls_ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, errors.New("redis URL parameter tls_ca: no PEM certificate in the file")
		}
	}
	if (cert == "") != (key == "") {
		return nil, errors.New("redis URL parameters tls_cert and tls_key go together")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("redis URL parameters tls_cert and tls_key: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

func openSourceURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
	addr, stream, opts, err := parseURL(u, cfg)
	if err != nil {
		return nil, err
	}
	s, err := Open(ctx, addr, stream, opts...)
	if err != nil {
		return nil, params.Explain(err)
	}
	return s, nil
}

func openPublisherURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Publisher, error) {
	addr, stream, opts, err := parseURL(u, cfg)
	if err != nil {
		return nil, err
	}
	p, err := NewPublisher(ctx, addr, stream, opts...)
	if err != nil {
		return nil, params.Explain(err)
	}
	return p, nil
}

func openDeadLettersURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (admin.DeadLetterQueue, error) {
	addr, stream, opts, err := parseURL(u, cfg)
	if err != nil {
		return nil, err
	}
	q, err := OpenDeadLetters(ctx, addr, stream, opts...)
	if err != nil {
		return nil, params.Explain(err)
	}
	return q, nil
}
