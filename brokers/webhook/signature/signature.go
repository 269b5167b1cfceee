package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/core/driver/option"
)

// Profile verifies the requests of one webhook provider.
type Profile interface {
	// Name returns the profile's name, as Open takes it: "standard",
	// "stripe", "github" or "shopify".
	Name() string
	// Verify checks the request's signature against the profile's secrets
	// and returns the event it carries; now is the time the request
	// arrived, against which the signed timestamp is checked. The error
	// wraps ErrNoSignature, ErrMalformed, ErrTimestamp, ErrBadSignature or
	// ErrNoID.
	Verify(h http.Header, body []byte, now time.Time) (Event, error)
}

// Event is what a verified request identifies.
type Event struct {
	// ID is the provider's event id, stable across redeliveries.
	ID string
	// Timestamp is the time the provider sent with the request: signed
	// for Standard Webhooks and Stripe, the unsigned X-Shopify-Triggered-At
	// for Shopify, zero when the provider sends none (GitHub).
	Timestamp time.Time
}

// The errors Verify wraps, one for each answer a webhook endpoint gives.
var (
	// ErrNoSignature reports that the signature header is missing or empty.
	ErrNoSignature = errors.New("no signature")
	// ErrMalformed reports a signature header that does not parse.
	ErrMalformed = errors.New("malformed header")
	// ErrBadSignature reports that no signature verifies under any secret.
	ErrBadSignature = errors.New("bad signature")
	// ErrTimestamp reports a request timestamp that is missing, malformed
	// or outside the tolerance: a stale, replayed or early request.
	ErrTimestamp = errors.New("bad timestamp")
	// ErrNoID reports a request whose signature verifies but that carries
	// no event id.
	ErrNoID = errors.New("no event id")
)

// DefaultTolerance is how far a signed timestamp may lie from the time of
// arrival, in either direction, unless WithTolerance sets another bound.
const DefaultTolerance = 5 * time.Minute

// maxEntries bounds the elements of a signature header a profile looks at.
const maxEntries = 16

// Option configures a profile.
type Option func(*config) error

type config struct {
	tolerance    time.Duration
	toleranceSet bool
}

// WithTolerance sets how far the request's timestamp may lie from the time
// of arrival, in either direction; it must be positive (the check cannot be
// turned off, only widened). Standard Webhooks and Stripe check their
// signed timestamp against DefaultTolerance without it. Shopify checks
// X-Shopify-Triggered-At, when present, only with it: Shopify keeps that
// time across hours of retries and does not sign it. GitHub refuses it, as
// GitHub sends no timestamp.
func WithTolerance(d time.Duration) Option {
	return option.Set("signature", "WithTolerance", option.Positive(d), func(c *config) {
		c.tolerance, c.toleranceSet = d, true
	})
}

// Open returns the profile named name ("standard", "stripe", "github" or
// "shopify") with secrets and opts: the constructor a URL's
// verify=NAME parameter selects.
func Open(name string, secrets []string, opts ...Option) (Profile, error) {
	switch name {
	case standardName:
		return StandardWebhooks(secrets, opts...)
	case stripeName:
		return Stripe(secrets, opts...)
	case githubName:
		return GitHub(secrets, opts...)
	case shopifyName:
		return Shopify(secrets, opts...)
	}
	return nil, fmt.Errorf("signature: unknown profile %q (known: %s)", name, strings.Join(Names(), ", "))
}

// Names returns the names Open takes, sorted.
func Names() []string {
	known := []string{standardName, stripeName, githubName, shopifyName}
	slices.Sort(known)
	return known
}

// newConfig applies opts over the defaults and checks secrets' count and
// emptiness, naming profile in the errors.
func newConfig(profile string, secrets []string, opts []Option) (config, error) {
	c := config{tolerance: DefaultTolerance}
	if err := option.Apply(&c, opts...); err != nil {
		return c, err
	}
	if len(secrets) == 0 {
		return c, fmt.Errorf("signature: %s: no secret given", profile)
	}
	for i, s := range secrets {
		if s == "" {
			return c, secretError(profile, i, len(secrets), "is empty")
		}
	}
	return c, nil
}

// secretError describes secret i of n by its position only, never its
// value.
func secretError(profile string, i, n int, what string) error {
	return fmt.Errorf("signature: %s: secret %d of %d %s", profile, i+1, n, what)
}

// fail wraps sentinel with the profile, the header (or "body") at fault and
// a detail that never holds a secret or a signature.
func fail(sentinel error, profile, where, format string, args ...any) error {
	return fmt.Errorf("signature: %s: %s: %s: %w", profile, where, fmt.Sprintf(format, args...), sentinel)
}

// rawKeys returns secrets as HMAC keys, byte for byte.
func rawKeys(secrets []string) [][]byte {
	keys := make([][]byte, len(secrets))
	for i, s := range secrets {
		keys[i] = []byte(s)
	}
	return keys
}

// macs returns the HMAC-SHA256 of the concatenated parts under each key.
func macs(keys [][]byte, parts ...[]byte) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		m := hmac.New(sha256.New, k)
		for _, p := range parts {
			m.Write(p)
		}
		out[i] = m.Sum(nil)
	}
	return out
}

// anyEqual reports whether one of sigs equals one of want, comparing in
// constant time.
func anyEqual(want, sigs [][]byte) bool {
	for _, w := range want {
		for _, s := range sigs {
			if hmac.Equal(w, s) {
				return true
			}
		}
	}
	return false
}

// parseUnix parses a Unix time in seconds written as canonical decimal
// digits (no sign, no leading zero, no spaces): the form the providers
// sign, so the raw string and the number sign alike.
func parseUnix(raw string) (time.Time, error) {
	if raw == "" {
		return time.Time{}, errors.New("missing")
	}
	if len(raw) > 18 || strings.Trim(raw, "0123456789") != "" || (raw[0] == '0' && raw != "0") {
		return time.Time{}, errors.New("not a Unix time in decimal seconds")
	}
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return time.Time{}, errors.New("not a Unix time in decimal seconds")
	}
	return time.Unix(v, 0), nil
}

// checkTolerance fails when ts lies more than tol before or after now.
func checkTolerance(ts, now time.Time, tol time.Duration) error {
	switch d := now.Sub(ts); {
	case d > tol:
		return fmt.Errorf("%v old, beyond the tolerance of %v", d.Round(time.Millisecond), tol)
	case d < -tol:
		return fmt.Errorf("%v in the future, beyond the tolerance of %v", (-d).Round(time.Millisecond), tol)
	}
	return nil
}

// decodeBase64 decodes standard base64, padded or not.
func decodeBase64(s string) ([]byte, error) {
	if b, err := base64.StdEncoding.Strict().DecodeString(s); err == nil {
		return b, nil
	}
	return base64.RawStdEncoding.Strict().DecodeString(s)
}
