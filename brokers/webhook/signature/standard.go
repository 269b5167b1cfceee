package signature

import (
	"crypto/ed25519"
	"encoding/base64"
	"net/http"
	"strings"
	"time"
)

const standardName = "standard"

// The headers of a Standard Webhooks request.
const (
	// HeaderWebhookID carries the Standard Webhooks message id, the event id.
	HeaderWebhookID = "Webhook-Id"
	// HeaderWebhookTimestamp carries the Unix time in seconds the request
	// was signed.
	HeaderWebhookTimestamp = "Webhook-Timestamp"
	// HeaderWebhookSignature carries the space-separated signatures:
	// "v1,<base64 HMAC-SHA256>" and "v1a,<base64 ed25519 signature>".
	HeaderWebhookSignature = "Webhook-Signature"
)

type standard struct {
	macKeys [][]byte
	pubKeys []ed25519.PublicKey
	tol     time.Duration
}

// StandardWebhooks returns the profile of the Standard Webhooks
// specification (standardwebhooks.com), which Svix implements. Each secret
// is either "whsec_" followed by the base64 HMAC key, for v1 signatures, or
// "whpk_" followed by the base64 ed25519 public key, for v1a signatures;
// the signed content is "webhook-id.webhook-timestamp.body". The event id
// is webhook-id; the timestamp must lie within the tolerance.
func StandardWebhooks(secrets []string, opts ...Option) (Profile, error) {
	c, err := newConfig(standardName, secrets, opts)
	if err != nil {
		return nil, err
	}
	p := &standard{tol: c.tolerance}
	for i, s := range secrets {
		switch {
		case strings.HasPrefix(s, "whsec_"):
			k, err := decodeBase64(s[len("whsec_"):])
			if err != nil || len(k) == 0 {
				return nil, secretError(standardName, i, len(secrets), "is not whsec_ followed by a base64 key")
			}
			p.macKeys = append(p.macKeys, k)
		case strings.HasPrefix(s, "whpk_"):
			k, err := decodeBase64(s[len("whpk_"):])
			if err != nil || len(k) != ed25519.PublicKeySize {
				return nil, secretError(standardName, i, len(secrets), "is not whpk_ followed by a base64 32-byte ed25519 public key")
			}
			p.pubKeys = append(p.pubKeys, ed25519.PublicKey(k))
		case strings.HasPrefix(s, "whsk_"):
			return nil, secretError(standardName, i, len(secrets), "is an ed25519 signing key (whsk_): give its public key (whpk_)")
		default:
			return nil, secretError(standardName, i, len(secrets), "has neither the whsec_ nor the whpk_ prefix")
		}
	}
	return p, nil
}

func (*standard) Name() string { return standardName }

func (p *standard) Verify(h http.Header, body []byte, now time.Time) (Event, error) {
	header := h.Get(HeaderWebhookSignature)
	if header == "" {
		return Event{}, fail(ErrNoSignature, standardName, HeaderWebhookSignature, "missing")
	}
	entries := strings.Fields(header)
	if len(entries) > maxEntries {
		return Event{}, fail(ErrMalformed, standardName, HeaderWebhookSignature, "%d signatures, more than %d", len(entries), maxEntries)
	}
	var v1, v1a [][]byte
	for i, e := range entries {
		version, sig, ok := strings.Cut(e, ",")
		if !ok {
			return Event{}, fail(ErrMalformed, standardName, HeaderWebhookSignature, "signature %d is not version,signature", i+1)
		}
		// A signature that does not decode cannot verify: it is skipped,
		// like a version this package does not know.
		switch version {
		case "v1":
			if b, err := base64.StdEncoding.Strict().DecodeString(sig); err == nil && len(p.macKeys) > 0 {
				v1 = append(v1, b)
			}
		case "v1a":
			if b, err := base64.StdEncoding.Strict().DecodeString(sig); err == nil && len(p.pubKeys) > 0 {
				v1a = append(v1a, b)
			}
		}
	}
	rawTS := h.Get(HeaderWebhookTimestamp)
	ts, err := parseUnix(rawTS)
	if err != nil {
		return Event{}, fail(ErrTimestamp, standardName, HeaderWebhookTimestamp, "%v", err)
	}
	id := h.Get(HeaderWebhookID)
	if len(v1) == 0 && len(v1a) == 0 {
		return Event{}, fail(ErrBadSignature, standardName, HeaderWebhookSignature, "no v1 or v1a signature to check against the secrets")
	}
	signed := make([]byte, 0, len(id)+len(rawTS)+len(body)+2)
	signed = append(append(append(append(append(signed, id...), '.'), rawTS...), '.'), body...)
	if !p.matches(signed, v1, v1a) {
		return Event{}, fail(ErrBadSignature, standardName, HeaderWebhookSignature, "none of %d signatures verifies", len(entries))
	}
	if err := checkTolerance(ts, now, p.tol); err != nil {
		return Event{}, fail(ErrTimestamp, standardName, HeaderWebhookTimestamp, "%v", err)
	}
	if id == "" {
		return Event{}, fail(ErrNoID, standardName, HeaderWebhookID, "missing")
	}
	return Event{ID: id, Timestamp: ts}, nil
}

// matches reports whether one of the v1 signatures is the HMAC of signed
// under a key, or one of the v1a signatures verifies under a public key.
func (p *standard) matches(signed []byte, v1, v1a [][]byte) bool {
	if len(v1) > 0 && anyEqual(macs(p.macKeys, signed), v1) {
		return true
	}
	for _, sig := range v1a {
		for _, k := range p.pubKeys {
			if ed25519.Verify(k, signed, sig) {
				return true
			}
		}
	}
	return false
}
