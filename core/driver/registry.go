package driver

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"sync"

	"github.com/idemq/idemq/internal/redact"
)

// OpenConfig is what a service gives an opener beside the URL.
type OpenConfig struct {
	// Logger is the logger the opened source or publisher logs to. Nil
	// leaves the adapter's default: a source then logs to the logger the
	// Consumer gives it (LoggerSetter), or to slog.Default() until then.
	Logger *slog.Logger
}

// SourceOpener opens a Source from a URL of a scheme it was registered for.
type SourceOpener func(ctx context.Context, u *url.URL, cfg OpenConfig) (Source, error)

// PublisherOpener opens a Publisher from a URL of a scheme it was
// registered for.
type PublisherOpener func(ctx context.Context, u *url.URL, cfg OpenConfig) (Publisher, error)

// StoreOpener opens a store from a URL of a scheme it was registered for.
// It returns a Store[Tx] for the store's own Tx type, as any; core.OpenStore
// checks the type.
type StoreOpener func(ctx context.Context, u *url.URL) (any, error)

var registry = struct {
	sync.RWMutex
	sources     map[string]SourceOpener
	publishers  map[string]PublisherOpener
	stores      map[string]StoreOpener
	deadLetters map[string]DeadLettersOpener
}{sources: map[string]SourceOpener{}, publishers: map[string]PublisherOpener{}, stores: map[string]StoreOpener{}, deadLetters: map[string]DeadLettersOpener{}}

// RegisterBroker makes a broker adapter available to core.OpenSource and
// core.OpenPublisher under a URL scheme, as database/sql drivers register
// themselves. Adapters call it from init, so importing an adapter package
// (for its side effect, if need be) is enough. It panics if the scheme is
// registered twice or an opener is nil.
func RegisterBroker(scheme string, src SourceOpener, pub PublisherOpener) {
	registry.Lock()
	defer registry.Unlock()
	if src == nil || pub == nil {
		panic("idemq: RegisterBroker " + scheme + ": nil opener")
	}
	register("RegisterBroker", scheme, registry.sources, src)
	registry.publishers[scheme] = pub
}

// RegisterStore makes a store available to core.OpenStore under a URL
// scheme. It panics if the scheme is registered twice or the opener is nil.
func RegisterStore(scheme string, open StoreOpener) {
	registry.Lock()
	defer registry.Unlock()
	if open == nil {
		panic("idemq: RegisterStore " + scheme + ": nil opener")
	}
	register("RegisterStore", scheme, registry.stores, open)
}

// register adds open under scheme; the registry is locked.
func register[O any](caller, scheme string, openers map[string]O, open O) {
	if _, dup := openers[scheme]; dup {
		panic("idemq: " + caller + " called twice for scheme " + scheme)
	}
	openers[scheme] = open
}

// open looks rawURL's scheme up in openers and opens it; errors name what
// was opened (kind: broker, publisher, dead-letter queue, store) and never
// contain credentials.
func open[O, R any](rawURL, kind string, openers map[string]O, call func(O, *url.URL) (R, error)) (R, *url.URL, error) {
	var zero R
	registered := kind
	if kind == "publisher" || kind == "dead-letter queue" {
		registered = "broker"
	}
	u, opener, err := lookup(rawURL, registered, openers)
	if err != nil {
		return zero, nil, err
	}
	r, err := call(opener, u)
	if err != nil {
		return zero, nil, fmt.Errorf("idemq: opening %s %s: %s", kind, redact.URL(rawURL), redact.Error(err, rawURL))
	}
	return r, u, nil
}

// OpenSource opens the broker adapter registered for rawURL's scheme.
// Errors never contain credentials. Services call core.OpenSource.
func OpenSource(ctx context.Context, rawURL string, cfg OpenConfig) (Source, error) {
	src, _, err := open(rawURL, "broker", registry.sources, func(o SourceOpener, u *url.URL) (Source, error) { return o(ctx, u, cfg) })
	return src, err
}

// OpenPublisher opens a publisher for rawURL's broker and destination.
// Errors never contain credentials. Services call core.OpenPublisher.
func OpenPublisher(ctx context.Context, rawURL string, cfg OpenConfig) (Publisher, error) {
	p, _, err := open(rawURL, "publisher", registry.publishers, func(o PublisherOpener, u *url.URL) (Publisher, error) { return o(ctx, u, cfg) })
	return p, err
}

// OpenStore opens the store registered for rawURL's scheme, whatever its
// transaction type, for tools that never run a handler (the idemq
// command's migrate, prune and stats): they use the store through Pruner,
// Migrator, Inspector and the returned Closer's Close. Errors never
// contain credentials. Services call core.OpenStore, which checks the
// transaction type.
func OpenStore(ctx context.Context, rawURL string) (Closer, error) {
	s, u, err := open(rawURL, "store", registry.stores, func(o StoreOpener, u *url.URL) (any, error) { return o(ctx, u) })
	if err != nil {
		return nil, err
	}
	c, ok := s.(Closer)
	if !ok {
		return nil, fmt.Errorf("idemq: store %s:// opened a %T, which has no Close and As methods", u.Scheme, s)
	}
	return c, nil
}

// Closer is what every Store has whatever its transaction type: Close and
// As.
type Closer interface {
	Close() error
	As(target any) bool
}

func lookup[O any](rawURL, kind string, openers map[string]O) (*url.URL, O, error) {
	var zero O
	u, err := redact.ParseURL(rawURL)
	if err != nil {
		// A malformed URL is not shown: no rule knows where its password ends.
		return nil, zero, fmt.Errorf("idemq: %w", err)
	}
	if u.Scheme == "" {
		return nil, zero, fmt.Errorf("idemq: URL %s has no scheme (like amqp://, kafka://, sqs://, mem://, postgres://, mysql://, sqlite://)", redact.URL(rawURL))
	}
	registry.RLock()
	open, ok := openers[u.Scheme]
	known := make([]string, 0, len(openers))
	for k := range openers {
		known = append(known, k)
	}
	registry.RUnlock()
	if !ok {
		sort.Strings(known)
		return nil, zero, fmt.Errorf("idemq: no %s registered for scheme %q (registered: %s); import its package, e.g. _ \"github.com/idemq/idemq/%ss/…\"",
			kind, u.Scheme, strings.Join(known, ", "), kind)
	}
	return u, open, nil
}
