package nats

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/redact"
)

func init() {
	driver.RegisterBroker("nats", openSourceURL, openPublisherURL)
	admin.RegisterDeadLetters("nats", openDeadLettersURL)
}

// urlParam is one URL parameter of nats:// URLs: the option it sets and
// how its value is read. Every side checks every parameter, so one URL
// serves the Source, the Publisher and DeadLetters.
type urlParam struct {
	option string
	build  func(v string) (Option, error)
}

var urlParams = map[string]urlParam{
	"consumer":      {"WithConsumer", func(v string) (Option, error) { return WithConsumer(v), nil }},
	"subject":       {"WithSubject", func(v string) (Option, error) { return WithSubject(v), nil }},
	"declare":       boolParam("WithDeclare", WithDeclare),
	"id_header":     {"WithIDHeader", func(v string) (Option, error) { return WithIDHeader(v), nil }},
	"ack_wait":      durationParam("WithAckWait", WithAckWait),
	"heartbeat":     boolParam("WithHeartbeat", WithHeartbeat),
	"max_extension": durationParam("WithMaxExtension", WithMaxExtension),
	"window": {"WithWindow", func(v string) (Option, error) {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, errors.New("not a number")
		}
		return WithWindow(n), nil
	}},
	"dlq_stream":  {"WithDeadLetterStream", func(v string) (Option, error) { return WithDeadLetterStream(v), nil }},
	"dlq_subject": {"WithDeadLetterSubject", func(v string) (Option, error) { return WithDeadLetterSubject(v), nil }},
	"token": {"", func(v string) (Option, error) {
		return WithNATSOptions(natsgo.Token(v)), nil
	}},
	"tls": {"", func(v string) (Option, error) {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, errors.New("not a boolean")
		}
		if !b {
			return nil, nil
		}
		return WithNATSOptions(natsgo.Secure()), nil
	}},
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

func boolParam(option string, o func(bool) Option) urlParam {
	return urlParam{option, func(v string) (Option, error) {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, errors.New("not a boolean")
		}
		return o(b), nil
	}}
}

func durationParam(option string, o func(time.Duration) Option) urlParam {
	return urlParam{option, func(v string) (Option, error) {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, errors.New("not a duration")
		}
		return o(d), nil
	}}
}

// fileParam is a parameter naming a file that build turns into a
// connection option (nil build: read together with another parameter).
func fileParam(build func(file string) (natsgo.Option, error)) urlParam {
	return urlParam{"", func(v string) (Option, error) {
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
		return WithNATSOptions(o), nil
	}}
}

// paramOfOption names the URL parameter that sets an option, for errors
// of URL-opened sources and publishers.
var paramOfOption = map[string]string{}

func init() {
	for p, up := range urlParams {
		if up.option != "" {
			paramOfOption[up.option] = p
		}
	}
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
	known := make([]string, 0, len(urlParams))
	for k := range urlParams {
		known = append(known, k)
	}
	sort.Strings(known)
	keys := make([]string, 0, len(query))
	for k := range query {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p, ok := urlParams[k]
		if !ok {
			return "", nil, fmt.Errorf("nats URL: unknown parameter %q (known: %s)", redact.Name(k), strings.Join(known, ", "))
		}
		o, err := p.build(query.Get(k))
		if err != nil {
			return "", nil, fmt.Errorf("nats URL parameter %s: %w", k, err)
		}
		if o != nil {
			opts = append(opts, o)
		}
	}
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
