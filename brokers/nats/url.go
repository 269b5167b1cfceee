package nats

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	natsgo "github.com/nats-io/nats.go"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/redact"
)

func init() {
	driver.RegisterBroker("nats", openSourceURL, openPublisherURL)
	admin.RegisterDeadLetters("nats", openDeadLettersURL)
}

// urlParams are the parameters of nats:// URLs. Every side checks every
// parameter, so one URL serves the Source, the Publisher and DeadLetters.
// init fills it: the options' errors name its parameters.
var urlParams urlparam.Table[Option]

func init() { urlParams = urlparam.Table[Option]{Scheme: "nats", Params: params()} }

func params() map[string]urlparam.Param[Option] {
	return map[string]urlparam.Param[Option]{
		"consumer":      urlparam.Text("WithConsumer", WithConsumer),
		"subject":       urlparam.Text("WithSubject", WithSubject),
		"declare":       urlparam.Bool("WithDeclare", WithDeclare),
		"id_header":     urlparam.Text("WithIDHeader", WithIDHeader),
		"ack_wait":      urlparam.Duration("WithAckWait", WithAckWait),
		"heartbeat":     urlparam.Bool("WithHeartbeat", WithHeartbeat),
		"max_extension": urlparam.Duration("WithMaxExtension", WithMaxExtension),
		"window":        urlparam.Int("WithWindow", WithWindow),
		"dlq_stream":    urlparam.Text("WithDeadLetterStream", WithDeadLetterStream),
		"dlq_subject":   urlparam.Text("WithDeadLetterSubject", WithDeadLetterSubject),
		"token":         urlparam.Text("", func(v string) Option { return WithNATSOptions(natsgo.Token(v)) }),
		"tls": urlparam.Bool("", func(b bool) Option {
			if !b {
				return nil
			}
			return WithNATSOptions(natsgo.Secure())
		}),
		"tls_ca":   fileParam(func(f string) (natsgo.Option, error) { return natsgo.RootCAs(f), nil }),
		"tls_cert": fileParam(nil), // read with tls_key
		"tls_key":  fileParam(nil),
		"nkey_seed": fileParam(func(f string) (natsgo.Option, error) {
			o, err := natsgo.NkeyOptionFromSeed(f)
			if err != nil {
				return nil, errors.New("cannot read an nkey seed from the file")
			}
			return o, nil
		}),
		"creds": fileParam(func(f string) (natsgo.Option, error) { return natsgo.UserCredentials(f), nil }),
	}
}

// fileParam is a parameter naming a file that build turns into a
// connection option (nil build: read together with another parameter).
func fileParam(build func(file string) (natsgo.Option, error)) urlparam.Param[Option] {
	return urlparam.Param[Option]{Read: func(v string) ([]Option, error) {
		if v == "" {
			return nil, errors.New("no file named")
		}
		if build == nil {
			return nil, nil
		}
		o, err := build(v)
		if err != nil {
			return nil, err
		}
		return []Option{WithNATSOptions(o)}, nil
	}}
}

// byURL marks a configuration as coming from a URL, so that its errors
// name URL parameters; it comes first among a URL's options.
func byURL(c *config) error {
	c.byURL = true
	return nil
}

// parseURL reads
//
//	nats://[user:pass@]host:4222[,host2:4222]/STREAM?consumer=NAME&subject=…
//
// into the stream and options. A logger in cfg is used as WithLogger
// would be.
func parseURL(u *url.URL, cfg driver.OpenConfig) (stream string, opts []Option, err error) {
	stream = strings.Trim(u.Path, "/")
	if stream == "" || strings.Contains(stream, "/") {
		return "", nil, errors.New("nats URL needs the stream as its path (nats://host:4222/STREAM?consumer=NAME)")
	}
	opts = []Option{byURL}
	if cfg.Logger != nil {
		opts = append(opts, WithLogger(cfg.Logger))
	}
	var servers []string
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			return "", nil, errors.New("nats URL has an empty host")
		}
		servers = append(servers, "nats://"+h)
	}
	opts = append(opts, WithServers(servers...))
	if u.User != nil {
		pass, ok := u.User.Password()
		if !ok {
			// NATS reads a lone user name as a token, but a URL's user
			// name shows wherever the URL is logged.
			return "", nil, errors.New("nats URL has a user name without a password; give a token with the token parameter instead")
		}
		opts = append(opts, WithNATSOptions(natsgo.UserInfo(u.User.Username(), pass)))
	}
	query, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return "", nil, fmt.Errorf("nats URL parameters: %w", err)
	}
	read, err := urlParams.Read(query)
	if err != nil {
		return "", nil, err
	}
	opts = append(opts, read...)
	cert, key := query.Get("tls_cert"), query.Get("tls_key")
	if (cert == "") != (key == "") {
		return "", nil, errors.New("nats URL parameters tls_cert and tls_key go together")
	}
	if cert != "" {
		opts = append(opts, WithNATSOptions(natsgo.ClientCert(cert, key)))
	}
	return stream, opts, nil
}

func openSourceURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
	stream, opts, err := parseURL(u, cfg)
	if err != nil {
		return nil, err
	}
	return Open(ctx, stream, opts...)
}

func openPublisherURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Publisher, error) {
	stream, opts, err := parseURL(u, cfg)
	if err != nil {
		return nil, err
	}
	return NewPublisher(ctx, stream, opts...)
}

func openDeadLettersURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (admin.DeadLetterQueue, error) {
	stream, opts, err := parseURL(u, cfg)
	if err != nil {
		return nil, err
	}
	return OpenDeadLetters(ctx, stream, opts...)
}
