// Package registry holds the URL-scheme registries behind
// driver.RegisterBroker, driver.RegisterStore and admin.RegisterDeadLetters,
// and the one way to open what they hold: parse the URL, find its scheme,
// call the opener, and report errors without credentials.
package registry

import (
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/idemq/idemq/internal/redact"
)

// Openers maps URL schemes to openers of one kind. The zero value is empty
// and ready to use.
type Openers[O any] struct {
	// Kind names what the openers open in errors: "broker", "store".
	Kind string
	mu   sync.RWMutex
	m    map[string]O
}

// Register adds open under scheme. It panics, naming caller, if the scheme
// is registered twice.
func (r *Openers[O]) Register(caller, scheme string, open O) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.m[scheme]; dup {
		panic("idemq: " + caller + " called twice for scheme " + scheme)
	}
	if r.m == nil {
		r.m = map[string]O{}
	}
	r.m[scheme] = open
}

// lookup parses rawURL and finds the opener of its scheme.
func (r *Openers[O]) lookup(rawURL string) (*url.URL, O, error) {
	var zero O
	if strings.TrimSpace(rawURL) == "" {
		return nil, zero, fmt.Errorf("idemq: the %s URL is empty (registered schemes: %s)", r.Kind, strings.Join(r.Schemes(), ", "))
	}
	if hint := dsnHint(rawURL); hint != "" {
		return nil, zero, fmt.Errorf("idemq: the %s URL is a database driver's DSN, not a URL: %s", r.Kind, hint)
	}
	u, err := redact.ParseURL(rawURL)
	if err != nil {
		// A malformed URL is not shown: no rule knows where its password ends.
		return nil, zero, fmt.Errorf("idemq: %w", err)
	}
	if u.Scheme == "" {
		return nil, zero, fmt.Errorf("idemq: URL %s has no scheme (registered: %s)", redact.URL(rawURL), strings.Join(r.Schemes(), ", "))
	}
	open, ok := r.Get(u.Scheme)
	if !ok {
		return nil, zero, fmt.Errorf("idemq: no %s registered for scheme %q (registered: %s); import its package, e.g. _ \"github.com/idemq/idemq/%ss/…\"",
			r.Kind, u.Scheme, strings.Join(r.Schemes(), ", "), r.Kind)
	}
	return u, open, nil
}

// Open opens rawURL with the opener of its scheme in r, through call.
// Errors name what (a source, a publisher, a dead-letter queue, a store)
// and never contain credentials.
func Open[O, R any](r *Openers[O], rawURL, what string, call func(O, *url.URL) (R, error)) (R, *url.URL, error) {
	var zero R
	u, opener, err := r.lookup(rawURL)
	if err != nil {
		return zero, nil, err
	}
	res, err := call(opener, u)
	if err != nil {
		return zero, nil, fmt.Errorf("idemq: opening %s %s: %s", what, redact.URL(rawURL), redact.Error(err, rawURL))
	}
	return res, u, nil
}

// The registries of the driver contract. Their openers are stored as any
// (this package cannot name driver's types): driver.SourceOpener,
// driver.PublisherOpener, driver.StoreOpener and driver.DeadLettersOpener.
var (
	Sources     = &Openers[any]{Kind: "broker"}
	Publishers  = &Openers[any]{Kind: "broker"}
	Stores      = &Openers[any]{Kind: "store"}
	DeadLetters = &Openers[any]{Kind: "broker"}
)

// Get returns the opener registered for scheme.
func (r *Openers[O]) Get(scheme string) (O, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	o, ok := r.m[scheme]
	return o, ok
}

// Schemes returns the registered schemes, sorted.
func (r *Openers[O]) Schemes() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	known := make([]string, 0, len(r.m))
	for k := range r.m {
		known = append(known, k)
	}
	sort.Strings(known)
	return known
}

// mysqlDSN matches go-sql-driver's DSN form: [user[:password]@]net(addr)/db.
var mysqlDSN = regexp.MustCompile(`^(?:([^:@/]*)(?::[^@]*)?@)?(tcp|unix)\(([^)]*)\)/([^?]*)(\?.*)?$`)

// dsnHint returns the URL to write for a DSN in a database driver's own
// form (go-sql-driver's user:pw@tcp(host:3306)/db, libpq's host=… dbname=…),
// without its password, or "".
func dsnHint(raw string) string {
	if m := mysqlDSN.FindStringSubmatch(raw); m != nil {
		user := ""
		if m[1] != "" {
			user = m[1] + ":PASSWORD@"
		}
		addr := m[3]
		if m[2] == "unix" {
			return "write mysql://" + user + "localhost/" + m[4] + " (a Unix socket needs the store's own constructor, mysql.Open with the DSN)"
		}
		return "write mysql://" + user + addr + "/" + m[4]
	}
	if strings.Contains(raw, "=") && !strings.Contains(raw, "://") {
		fields := strings.Fields(raw)
		kv := map[string]string{}
		for _, f := range fields {
			if k, v, ok := strings.Cut(f, "="); ok {
				kv[k] = v
			}
		}
		if _, ok := kv["dbname"]; ok || kv["host"] != "" {
			host, port := kv["host"], kv["port"]
			if port != "" {
				host += ":" + port
			}
			user := ""
			if kv["user"] != "" {
				user = kv["user"] + ":PASSWORD@"
			}
			return "write postgres://" + user + host + "/" + kv["dbname"]
		}
	}
	return ""
}
