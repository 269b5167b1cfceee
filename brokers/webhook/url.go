package webhook

import (
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
	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/redact"
)

// The scheme registers a source and dead letters, no publisher: the
// provider sends the requests, so core.OpenPublisher says no publisher is
// registered for webhook.
func init() {
	driver.RegisterSource("webhook", func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
		var logger Option // nil options are skipped
		if cfg.Logger != nil {
			logger = WithLogger(cfg.Logger)
		}
		return Open(ctx, u.String(), logger)
	})
}

// verifyParams are the URL parameters read together into a Profile.
type verifyParams struct {
	profile, secretFile, secretEnv, tolerance string
	set                                       map[string]bool
}

// params is the webhook URL's parameter table; the verification ones are
// collected into v.
func params(v *verifyParams) urlparam.Table[Option] {
	keep := func(f *string, name string, check func(string) error) urlparam.Param[Option] {
		return urlparam.Param[Option]{Read: func(s string) ([]Option, error) {
			if err := check(s); err != nil {
				return nil, err
			}
			*f, v.set[name] = s, true
			return nil, nil
		}}
	}
	nonEmpty := func(s string) error {
		if s == "" {
			return errors.New("empty")
		}
		return nil
	}
	profiles := func(s string) error {
		if slices.Contains(signature.Names(), s) {
			return nil
		}
		return errors.New("not " + profileList())
	}
	duration := func(s string) error {
		if d, err := time.ParseDuration(s); err != nil || d <= 0 {
			return errors.New("not a positive duration like 5m")
		}
		return nil
	}
	return urlparam.Table[Option]{Scheme: "webhook", Params: map[string]urlparam.Param[Option]{
		"verify":      keep(&v.profile, "verify", profiles),
		"secret_file": keep(&v.secretFile, "secret_file", nonEmpty),
		"secret_env":  keep(&v.secretEnv, "secret_env", nonEmpty),
		"tolerance":   keep(&v.tolerance, "tolerance", duration),
		"max_body":    urlparam.Int("WithMaxBody", func(n int) Option { return WithMaxBody(int64(n)) }),
		"wait":        urlparam.Duration("WithWait", WithWait),
		"answer_by":   urlparam.Duration("WithAnswerBy", WithAnswerBy),
		"horizon":     urlparam.Duration("WithHorizon", WithHorizon),
		"park_dir":    urlparam.NonEmpty("WithParkDir", WithParkDir),
	}}
}

// parseURL reads webhook://host:port/path?verify=…&… into the address to
// listen on, the path to serve and options (the profile's among them).
func parseURL(raw string) (addr, path string, opts []Option, t urlparam.Table[Option], err error) {
	v := &verifyParams{set: map[string]bool{}}
	t = params(v)
	u, err := redact.ParseURL(raw)
	if err != nil {
		return "", "", nil, t, fmt.Errorf("webhook: %w", err)
	}
	if u.Scheme != "webhook" || u.Host == "" || u.Port() == "" || u.User != nil || u.Opaque != "" {
		return "", "", nil, t, errors.New("webhook URL needs the scheme webhook://, a host and a port to listen on (0: any free one), no user, and the path to serve (webhook://127.0.0.1:8080/hooks/stripe?verify=stripe&secret_file=…&park_dir=…)")
	}
	path = u.Path
	if path == "" {
		path = "/"
	}
	q, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return "", "", nil, t, fmt.Errorf("webhook URL parameters: %w", err)
	}
	opts, err = t.Read(q)
	if err != nil {
		return "", "", nil, t, err
	}
	p, err := v.open()
	if err != nil {
		return "", "", nil, t, err
	}
	return u.Host, path, append(opts, WithProfile(p)), t, nil
}

// profileList names the profiles verify= takes: "github, shopify,
// standard or stripe".
func profileList() string {
	n := signature.Names()
	return strings.Join(n[:len(n)-1], ", ") + " or " + n[len(n)-1]
}

// open builds the profile the verification parameters describe.
func (v *verifyParams) open() (signature.Profile, error) {
	if !v.set["verify"] {
		return nil, errors.New("webhook URL parameter verify: required: " + profileList())
	}
	from := "secret_file"
	var secrets []string
	switch {
	case v.set["secret_file"] == v.set["secret_env"]:
		return nil, errors.New("webhook URL parameters secret_file and secret_env: give exactly one")
	case v.set["secret_file"]:
		b, err := os.ReadFile(v.secretFile)
		if err != nil {
			return nil, fmt.Errorf("webhook URL parameter secret_file: %w", pathless(err))
		}
		secrets = lines(string(b))
	default:
		from, secrets = "secret_env", lines(os.Getenv(v.secretEnv))
	}
	if len(secrets) == 0 {
		return nil, fmt.Errorf("webhook URL parameter %s: no secret in it (one a line)", from)
	}
	var opts []signature.Option
	if v.set["tolerance"] {
		d, _ := time.ParseDuration(v.tolerance)
		opts = append(opts, signature.WithTolerance(d))
	}
	p, err := signature.Open(v.profile, secrets, opts...)
	if err != nil {
		msg, where := err.Error(), from
		if strings.Contains(msg, "option WithTolerance: ") {
			msg, where = msg[strings.Index(msg, "option WithTolerance: ")+len("option WithTolerance: "):], "tolerance"
		}
		return nil, fmt.Errorf("webhook URL parameter %s: %s", where, msg)
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
func Open(ctx context.Context, rawURL string, opts ...Option) (*Source, error) {
	addr, path, fromURL, t, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	c, err := resolve(fromURL, opts, t.Explain)
	if err != nil {
		return nil, err
	}
	s := newSource(c)
	var lc net.ListenConfig
	s.ln, err = lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("webhook: listening on %s: %w", addr, err)
	}
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
	s.served = make(chan struct{})
	go func() {
		defer close(s.served)
		if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log().Error("idemq webhook: the server stopped", "addr", s.ln.Addr(), "error", err)
		}
	}()
	return s, nil
}

// pathless is err without the path a *fs.PathError quotes: "open: no such
// file or directory".
func pathless(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}
