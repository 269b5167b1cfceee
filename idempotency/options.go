package idempotency

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/internal/sqlident"
)

// Defaults of the options.
const (
	// DefaultName is the consumer name the keys are claimed under.
	DefaultName = "http"
	// DefaultTable is the stored responses' table.
	DefaultTable = "idemq_http_responses"
	// DefaultLease is how long a request in progress holds its key
	// without a renewal, on the stores that hold keys by leases.
	DefaultLease = 30 * time.Second
	// DefaultMaxBody is the largest request body read, in bytes.
	DefaultMaxBody = 1 << 20
)

// DefaultStoredHeaders are the response headers stored and replayed when
// WithStoredHeaders is not given. Set-Cookie and other per-client headers
// are left out on purpose.
var DefaultStoredHeaders = []string{"Content-Type", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified", "Link", "Retry-After"}

// Option configures a Middleware. An invalid value makes New fail with an
// error naming the option.
type Option func(*config) error

type config struct {
	name     string
	table    string
	scope    func(*http.Request) string
	optional bool
	lease    time.Duration
	maxBody  int64
	headers  []string
	logger   *slog.Logger
}

func defaults() config {
	return config{
		name:    DefaultName,
		table:   DefaultTable,
		lease:   DefaultLease,
		maxBody: DefaultMaxBody,
		headers: canonical(DefaultStoredHeaders),
		logger:  slog.Default(),
	}
}

const pkg = "idempotency"

// WithName sets the consumer name under which keys are claimed and leased
// in the store's tables: give each API (or each service sharing a
// database) its own. Not empty, at most 255 bytes (the MySQL store's
// limit). Default "http".
func WithName(name string) Option {
	err := option.Refuse(name == "" || len(name) > 255, "%q must be 1 to 255 bytes", name)
	return option.Set[config](pkg, "WithName", err, func(c *config) { c.name = name })
}

// WithTable sets the stored responses' table: ASCII letters, digits and
// underscores, at most 63 characters, not starting with a digit. Default
// "idemq_http_responses".
func WithTable(name string) Option {
	return option.Set[config](pkg, "WithTable", sqlident.Check(name), func(c *config) { c.table = name })
}

// WithScope sets what a key is unique within: the same key sent in two
// scopes names two requests. Required, since only the service knows who
// sent a request: return the authenticated principal (the account,
// tenant or API client, as the service's authentication found it, from
// the request's context or headers) and the route, such as
// account + " " + r.Method + " " + r.URL.Path, so that one client can
// neither replay nor block another's key. A service with a single client
// says so by returning the route alone. The scope runs after the
// service's authentication and before the handler.
func WithScope(scope func(r *http.Request) string) Option {
	return option.Set[config](pkg, "WithScope", option.NotNil(scope != nil, "scope function"), func(c *config) { c.scope = scope })
}

// WithKeyOptional lets requests without an Idempotency-Key through: their
// handler runs in a transaction of its own, with no claim and no stored
// response. Default: the key is required and a request without one is
// answered 400.
func WithKeyOptional() Option {
	return func(c *config) error { c.optional = true; return nil }
}

// WithLease sets how long a request in progress holds its key without a
// renewal, on the stores that hold keys by leases (MySQL/MariaDB,
// SQLite). The middleware renews it every third of that while the handler
// runs; after a crash the key is free again once the lease ran out, and a
// retry then runs the request. Concurrent requests with the key are
// answered 409 meanwhile, with Retry-After 1 while the lease is renewed
// and its remaining seconds once it missed its renewals.
// On PostgreSQL it has no effect: the handler's transaction holds the key
// by its uncommitted claim for as long as it runs, and no longer than its
// connection lives. At least 30ms. Default 30s.
func WithLease(d time.Duration) Option {
	return option.Set[config](pkg, "WithLease", option.AtLeast(d, 30*time.Millisecond), func(c *config) { c.lease = d })
}

// WithMaxBody sets the largest request body, in bytes, the middleware
// reads (it fingerprints the whole body before the handler runs); a
// larger one is answered 413. Default 1 MiB.
func WithMaxBody(n int64) Option {
	return option.Set[config](pkg, "WithMaxBody", option.Positive(n), func(c *config) { c.maxBody = n })
}

// WithStoredHeaders sets the response headers stored with the status and
// body and sent again on a replay; the first answer carries every header
// the handler set. Default DefaultStoredHeaders.
func WithStoredHeaders(names ...string) Option {
	var err error
	for _, n := range names {
		if n == "" {
			err = fmt.Errorf("empty header name")
		}
	}
	return option.Set[config](pkg, "WithStoredHeaders", err, func(c *config) { c.headers = canonical(names) })
}

// WithLogger sets where failures that do not reach a response are logged
// (a lease release or renewal that failed). Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return option.Set[config](pkg, "WithLogger", option.NotNil(l != nil, "logger"), func(c *config) { c.logger = l })
}

func canonical(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = http.CanonicalHeaderKey(n)
	}
	return out
}
