package effects

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net/http"
	"strconv"

	"github.com/idemq/idemq/core"
)

// MinSecretLength is the shortest secret NewKeyer and IdempotencyKey
// accept, in bytes. Use 32 random bytes.
const MinSecretLength = 16

// IdempotencyKey returns the key for one external call: the unpadded
// base64url encoding (43 characters of A-Z a-z 0-9 - _) of
// HMAC-SHA256(secret, consumer, messageID, purpose), each field prefixed
// with its length so that no two different triples collide. It is the same
// on every redelivery of the message, different for every consumer and
// purpose (a charge and its receipt e-mail get different keys), and cannot
// be computed without the secret. It fails when the secret is shorter than
// MinSecretLength.
func IdempotencyKey(secret []byte, consumer, messageID, purpose string) (string, error) {
	k, err := NewKeyer(secret)
	if err != nil {
		return "", err
	}
	return k.Key(consumer, messageID, purpose), nil
}

// Keyer derives idempotency keys with one secret.
type Keyer struct {
	secret []byte
}

// NewKeyer returns a Keyer for secret (copied). It fails, naming the
// secret, when it is shorter than MinSecretLength.
func NewKeyer(secret []byte) (*Keyer, error) {
	if len(secret) < MinSecretLength {
		return nil, fmt.Errorf("effects: secret is %d bytes, at least %d required (use 32 random bytes)", len(secret), MinSecretLength)
	}
	return &Keyer{secret: append([]byte(nil), secret...)}, nil
}

// Key returns IdempotencyKey(secret, consumer, messageID, purpose).
func (k *Keyer) Key(consumer, messageID, purpose string) string {
	mac := hmac.New(sha256.New, k.secret)
	var n [binary.MaxVarintLen64]byte
	for _, f := range []string{consumer, messageID, purpose} {
		mac.Write(n[:binary.PutUvarint(n[:], uint64(len(f)))])
		mac.Write([]byte(f))
	}
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// ForMessage returns ctx carrying the key of m for purpose, for the
// consumer running the handler (core.ConsumerName(ctx)). Requests made with
// it through a Transport send the key.
func (k *Keyer) ForMessage(ctx context.Context, m *core.Message, purpose string) context.Context {
	return WithIdempotencyKey(ctx, k.Key(core.ConsumerName(ctx), m.ID, purpose))
}

type keyCtx struct{}

// WithIdempotencyKey returns ctx carrying key for Transport.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// IdempotencyKeyFrom returns the key ctx carries, if any.
func IdempotencyKeyFrom(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtx{}).(string)
	return k, ok && k != ""
}

// DefaultHeader is the header Transport sets when Header is empty.
const DefaultHeader = "Idempotency-Key"

// Transport is an http.RoundTripper that sets the idempotency key carried
// by the request's context (WithIdempotencyKey, Keyer.ForMessage) as a
// header, then sends the request through Base. A request that already has
// the header, or whose context has no key, is sent unchanged.
type Transport struct {
	// Base sends the requests. Default http.DefaultTransport.
	Base http.RoundTripper
	// Header is the header's name. Default "Idempotency-Key"; some
	// providers use another (PayPal-Request-Id, X-Idempotency-Key).
	Header string
	// Quote sends the key as a structured-field string ("…" in double
	// quotes), as the IETF httpapi draft specifies. Default false: the bare
	// key, which Stripe and most providers expect.
	Quote bool
}

// RoundTrip implements http.RoundTripper. Following its contract, the
// caller's request is not modified: the header goes on a clone.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	name := t.Header
	if name == "" {
		name = DefaultHeader
	}
	key, ok := IdempotencyKeyFrom(req.Context())
	if !ok || req.Header.Get(name) != "" {
		return base.RoundTrip(req)
	}
	if t.Quote {
		key = strconv.Quote(key) // the key's characters need no escaping
	}
	r := req.Clone(req.Context())
	r.Header.Set(name, key)
	return base.RoundTrip(r)
}
