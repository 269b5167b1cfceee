package core

import (
	"context"
	"fmt"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"sync"

	"github.com/idemq/idemq/internal/redact"
)

// Publisher sends messages to the destination it was opened for, setting
// each message's business id where its broker carries it (AMQP message_id,
// the Kafka or SQS message-id header) and the caller's trace context in the
// headers. Publish returns only after the broker confirmed every message.
type Publisher interface {
	Publish(ctx context.Context, msgs ...*Message) error
	Close() error
}

// SourceOpener opens a Source from a URL of a scheme it was registered for.
type SourceOpener func(ctx context.Context, u *url.URL) (Source, error)

// PublisherOpener opens a Publisher from a URL of a scheme it was
// registered for.
type PublisherOpener func(ctx context.Context, u *url.URL) (Publisher, error)

// StoreOpener opens a store from a URL of a scheme it was registered for.
// It returns a Store[Tx] for the store's own Tx type, as any; OpenStore
// checks the type.
type StoreOpener func(ctx context.Context, u *url.URL) (any, error)

var registry = struct {
	sync.RWMutex
	sources    map[string]SourceOpener
	publishers map[string]PublisherOpener
	stores     map[string]StoreOpener
}{sources: map[string]SourceOpener{}, publishers: map[string]PublisherOpener{}, stores: map[string]StoreOpener{}}

// RegisterBroker makes a broker adapter available to OpenSource and
// OpenPublisher under a URL scheme, as database/sql drivers register
// themselves. Adapters call it from init, so importing an adapter package
// (for its side effect, if need be) is enough. It panics if the scheme is
// registered twice or an opener is nil.
func RegisterBroker(scheme string, src SourceOpener, pub PublisherOpener) {
	registry.Lock()
	defer registry.Unlock()
	if src == nil || pub == nil {
		panic("idemq: RegisterBroker " + scheme + ": nil opener")
	}
	if _, dup := registry.sources[scheme]; dup {
		panic("idemq: RegisterBroker called twice for scheme " + scheme)
	}
	registry.sources[scheme] = src
	registry.publishers[scheme] = pub
}

// RegisterStore makes a store available to OpenStore under a URL scheme.
// It panics if the scheme is registered twice or the opener is nil.
func RegisterStore(scheme string, open StoreOpener) {
	registry.Lock()
	defer registry.Unlock()
	if open == nil {
		panic("idemq: RegisterStore " + scheme + ": nil opener")
	}
	if _, dup := registry.stores[scheme]; dup {
		panic("idemq: RegisterStore called twice for scheme " + scheme)
	}
	registry.stores[scheme] = open
}

// OpenSource opens the broker adapter registered for rawURL's scheme
// (amqp://, kafka://, sqs://, mem://, …). Errors never contain credentials.
func OpenSource(ctx context.Context, rawURL string) (Source, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	registry.RLock()
	open, ok := registry.sources[u.Scheme]
	registry.RUnlock()
	if !ok {
		return nil, unknownScheme("broker", u.Scheme, registeredBrokers())
	}
	src, err := open(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("idemq: opening broker %s: %s", Redact(rawURL), RedactError(err, rawURL))
	}
	return src, nil
}

// OpenPublisher opens a publisher for rawURL's broker and destination.
// Errors never contain credentials.
func OpenPublisher(ctx context.Context, rawURL string) (Publisher, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	registry.RLock()
	open, ok := registry.publishers[u.Scheme]
	registry.RUnlock()
	if !ok {
		return nil, unknownScheme("broker", u.Scheme, registeredBrokers())
	}
	p, err := open(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("idemq: opening publisher %s: %s", Redact(rawURL), RedactError(err, rawURL))
	}
	return p, nil
}

// OpenStore opens the store registered for rawURL's scheme (postgres://,
// mysql://, sqlite://, …) and checks that its handlers take transactions of
// type Tx: pgx.Tx for Postgres, *sql.Tx for MySQL and SQLite. Errors never
// contain credentials.
func OpenStore[Tx any](ctx context.Context, rawURL string) (Store[Tx], error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	registry.RLock()
	open, ok := registry.stores[u.Scheme]
	registry.RUnlock()
	if !ok {
		return nil, unknownScheme("store", u.Scheme, registeredStores())
	}
	s, err := open(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("idemq: opening store %s: %s", Redact(rawURL), RedactError(err, rawURL))
	}
	store, ok := s.(Store[Tx])
	if !ok {
		if c, isCloser := s.(interface{ Close() }); isCloser {
			c.Close()
		} else if c, isCloser := s.(interface{ Close() error }); isCloser {
			c.Close()
		}
		return nil, fmt.Errorf("idemq: store %s:// gives handlers a %s, not a %s", u.Scheme, txTypeOf(s), reflect.TypeFor[Tx]())
	}
	return store, nil
}

func txTypeOf(s any) string {
	m, ok := reflect.TypeOf(s).MethodByName("Begin")
	if !ok || m.Type.NumOut() == 0 {
		return "different transaction type"
	}
	txn := m.Type.Out(0)
	if tm, ok := txn.MethodByName("Tx"); ok && tm.Type.NumOut() == 1 {
		return tm.Type.Out(0).String()
	}
	return "different transaction type"
}

func parseURL(rawURL string) (*url.URL, error) {
	u, err := redact.ParseURL(rawURL)
	if err != nil {
		// A malformed URL is not shown: no rule knows where its password ends.
		return nil, fmt.Errorf("idemq: %w", err)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("idemq: URL %s has no scheme (like amqp://, kafka://, sqs://, mem://, postgres://, mysql://, sqlite://)", Redact(rawURL))
	}
	return u, nil
}

func unknownScheme(kind, scheme string, known []string) error {
	return fmt.Errorf("idemq: no %s registered for scheme %q (registered: %s); import its package, e.g. _ \"github.com/idemq/idemq/%ss/…\"",
		kind, scheme, strings.Join(known, ", "), kind)
}

func registeredBrokers() []string {
	registry.RLock()
	defer registry.RUnlock()
	return sortedKeys(registry.sources)
}

func registeredStores() []string {
	registry.RLock()
	defer registry.RUnlock()
	return sortedKeys(registry.stores)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Redact returns rawURL with its password and any secret-looking query
// parameter (password, secret, token, key, sasl…) replaced by "xxxxx", for
// logs and errors. It works on URLs that do not parse, too: then it hides
// everything from the first ':' after the user name to the last '@', more
// than the password, never less.
func Redact(rawURL string) string { return redact.URL(rawURL) }

// RedactError returns err's text with every secret of rawURL (its password
// and secret query values, as written, unescaped and escaped) replaced by
// "xxxxx", for drivers whose errors quote the URL they were given.
func RedactError(err error, rawURL string) string { return redact.Error(err, rawURL) }
