package core

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"sync"
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
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse quotes the whole URL, password included.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("idemq: invalid URL %s: %v", Redact(rawURL), err)
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

// secretParams are query parameters whose values Redact hides.
var secretParams = regexp.MustCompile(`(?i)([?&](?:[a-z0-9_.-]*(?:password|passwd|pwd|secret|token|key|credential|sasl)[a-z0-9_.-]*)=)[^&#]*`)

// userinfo matches the user:password@ part of a URL as url.Parse splits
// it: the user ends at the first ':', the password runs to the last '@'
// before the path, so a password holding a raw '@' or ':' is covered.
var userinfo = regexp.MustCompile(`(//[^/?#:]*):[^/?#]*@`)

// looseUserinfo is for URLs that do not parse (a raw '/' or '#' in the
// password, say): everything from the first ':' after "//user" to the
// last '@' of the string is treated as the password. It may hide more
// than the password, never less.
var looseUserinfo = regexp.MustCompile(`(//[^/?#:@]*):.*@`)

// userinfoOf picks the pattern for rawURL.
func userinfoOf(rawURL string) *regexp.Regexp {
	if _, err := url.Parse(rawURL); err != nil {
		return looseUserinfo
	}
	return userinfo
}

// Redact returns rawURL with its password and any secret-looking query
// parameter (password, secret, token, key, sasl…) replaced by "xxxxx", for
// logs and errors. It works on URLs that do not parse, too.
func Redact(rawURL string) string {
	s := userinfoOf(rawURL).ReplaceAllString(rawURL, "${1}:xxxxx@")
	return secretParams.ReplaceAllString(s, "${1}xxxxx")
}

// RedactError returns err's text with every secret of rawURL (its password
// and secret query values, raw and escaped) replaced by "xxxxx", for
// drivers whose errors quote the URL they were given.
func RedactError(err error, rawURL string) string {
	msg := err.Error()
	for _, secret := range urlSecrets(rawURL) {
		if len(secret) >= 3 {
			msg = strings.ReplaceAll(msg, secret, "xxxxx")
		}
	}
	return msg
}

func urlSecrets(rawURL string) []string {
	var out []string
	if m := userinfoOf(rawURL).FindStringSubmatch(rawURL); m != nil {
		whole := m[0]
		pass := whole[len(m[1])+1 : len(whole)-1]
		out = append(out, pass)
		if un, err := url.PathUnescape(pass); err == nil && un != pass {
			out = append(out, un)
		}
	}
	for _, m := range secretParams.FindAllStringSubmatchIndex(rawURL, -1) {
		v := rawURL[m[3]:m[1]]
		out = append(out, v)
		if un, err := url.QueryUnescape(v); err == nil && un != v {
			out = append(out, un)
		}
	}
	return out
}
