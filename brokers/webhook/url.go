package webhook

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/core/driver/urlparam"
)

// The scheme registers a source and dead letters, no publisher: the
// provider sends the requests, so core.OpenPublisher finds none for
// webhook.
func init() {
	driver.RegisterDeadLetters("webhook", func(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.DeadLetters, error) {
		return OpenDeadLetters(ctx, u.String())
	})
	driver.RegisterSource("webhook", func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
		return Open(ctx, u.String(), driver.LoggerOption(cfg, WithLogger))
	})
}

// params is the webhook URL's parameter table. The verification
// parameters (verify, secret_file, secret_env, tolerance) are only checked
// here: profile reads them together into a Profile.
var params = urlparam.Table[Option]{Scheme: "webhook", Params: map[string]urlparam.Param[Option]{
	"verify": {Read: func(s string) ([]Option, error) {
		return nil, option.Refuse(!slices.Contains(signature.Names(), s), "not %s", profileList())
	}},
	"secret_file": urlparam.NonEmpty("", func(string) Option { return nil }),
	"secret_env":  urlparam.NonEmpty("", func(string) Option { return nil }),
	"tolerance": {Option: "WithTolerance", Read: func(s string) ([]Option, error) {
		d, err := time.ParseDuration(s)
		return nil, option.Refuse(err != nil || d <= 0, "not a positive duration like 5m")
	}},
	"max_body":  urlparam.Int("WithMaxBody", func(n int) Option { return WithMaxBody(int64(n)) }),
	"wait":      urlparam.Duration("WithWait", WithWait),
	"answer_by": urlparam.Duration("WithAnswerBy", WithAnswerBy),
	"horizon":   urlparam.Duration("WithHorizon", WithHorizon),
	"park_dir":  urlparam.NonEmpty("WithParkDir", WithParkDir),
}}

// readURL parses a webhook URL into its options and its parameters.
func readURL(raw string) (*url.URL, url.Values, []Option, error) {
	u, err := urlparam.ParseURL(raw)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("webhook: %w", err)
	}
	q, err := urlparam.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("webhook URL parameters: %w", err)
	}
	opts, err := params.Read(q)
	return u, q, opts, err
}

// profileList names the profiles verify= takes: "github, shopify,
// standard or stripe".
func profileList() string {
	n := signature.Names()
	return strings.Join(n[:len(n)-1], ", ") + " or " + n[len(n)-1]
}

// profile builds the profile the verification parameters of q describe.
func profile(q url.Values) (signature.Profile, error) {
	if !q.Has("verify") {
		return nil, errors.New("webhook URL parameter verify: required: " + profileList())
	}
	from := "secret_file"
	var secrets []string
	switch {
	case q.Has("secret_file") == q.Has("secret_env"):
		return nil, errors.New("webhook URL parameters secret_file and secret_env: give exactly one")
	case q.Has("secret_file"):
		b, err := os.ReadFile(q.Get("secret_file"))
		if err != nil {
			if pe, ok := errors.AsType[*fs.PathError](err); ok {
				err = fmt.Errorf("%s: %w", pe.Op, pe.Err) // not the file's path
			}
			return nil, fmt.Errorf("webhook URL parameter secret_file: %w", err)
		}
		secrets = lines(string(b))
	default:
		from, secrets = "secret_env", lines(os.Getenv(q.Get("secret_env")))
	}
	if len(secrets) == 0 {
		return nil, fmt.Errorf("webhook URL parameter %s: no secret in it (one a line)", from)
	}
	var opts []signature.Option
	if q.Has("tolerance") {
		d, _ := time.ParseDuration(q.Get("tolerance"))
		opts = append(opts, signature.WithTolerance(d))
	}
	p, err := signature.Open(q.Get("verify"), secrets, opts...)
	if err != nil {
		if e := params.Explain(err); e != err {
			return nil, e // WithTolerance's, as tolerance's
		}
		return nil, fmt.Errorf("webhook URL parameter %s: %w", from, err)
	}
	return p, nil
}

// lines are the non-blank lines of s, each without its line ending: one
// secret a line.
func lines(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		l = strings.TrimRight(l, "\r\n")
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

// Open starts an HTTP server listening on the host and port of rawURL
// (webhook://HOST:PORT/PATH?verify=…; port 0 takes a free one, see Addr)
// that serves the Source at PATH, and 404 elsewhere. Options given in code
// apply after the URL's parameters. The Source's Close shuts the server
// down. The server speaks plain HTTP: put TLS in front of it (a proxy or a
// load balancer), or mount a NewSource in a server of your own.
//
// Parameters: verify (standard, stripe, github or shopify; required),
// secret_file (a file holding one secret a line; several for a rotation)
// or secret_env (an environment variable holding them the same way),
// tolerance (signature.WithTolerance), max_body (bytes), wait, answer_by,
// horizon, and park_dir (required). A bad parameter fails Open, named, its
// value never shown but for park_dir's path, which is no secret and which
// the operator must create.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Source, error) {
	u, q, fromURL, err := readURL(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "webhook" || u.Host == "" || u.Port() == "" || u.User != nil || u.Opaque != "" {
		return nil, errors.New("webhook URL needs the scheme webhook://, a host and a port to listen on (0: any free one), no user, and the path to serve (webhook://127.0.0.1:8080/hooks/stripe?verify=stripe&secret_file=…&park_dir=…)")
	}
	p, err := profile(q)
	if err != nil {
		return nil, err
	}
	s, err := build(append(fromURL, WithProfile(p)), opts, params.Explain)
	if err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	if s.ln, err = lc.Listen(ctx, "tcp", u.Host); err != nil {
		return nil, fmt.Errorf("webhook: listening on %s: %w", u.Host, err)
	}
	path := cmp.Or(u.Path, "/")
	s.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != path {
				http.NotFound(w, r)
				return
			}
			s.ServeHTTP(w, r)
		}),
		ConnState:         s.track,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	s.served, s.fresh = make(chan struct{}), map[net.Conn]struct{}{}
	go func() {
		defer close(s.served)
		if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log().Error("idemq webhook: the server stopped", "addr", s.ln.Addr(), "error", err)
		}
	}()
	return s, nil
}
