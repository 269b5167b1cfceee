package signature

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"
)

const stripeName = "stripe"

// HeaderStripeSignature carries Stripe's signature:
// "t=<unix seconds>,v1=<hex HMAC-SHA256>[,v1=…][,v0=…]".
const HeaderStripeSignature = "Stripe-Signature"

type stripe struct {
	keys [][]byte
	tol  time.Duration
}

// Stripe returns the profile of Stripe's webhook signatures. Each secret is
// an endpoint's signing secret ("whsec_…"), used as it is, bytes and all;
// the signed payload is "t.body" and only v1 signatures count (v0 and
// unknown schemes are ignored, as are v1 values that are not hex). The
// event id is the body's top-level "id"; t must lie within the tolerance.
func Stripe(secrets []string, opts ...Option) (Profile, error) {
	c, err := newConfig(stripeName, secrets, opts)
	if err != nil {
		return nil, err
	}
	return &stripe{keys: rawKeys(secrets), tol: c.tolerance}, nil
}

func (*stripe) Name() string { return stripeName }

func (p *stripe) Verify(h http.Header, body []byte, now time.Time) (Event, error) {
	header := h.Get(HeaderStripeSignature)
	if header == "" {
		return Event{}, fail(ErrNoSignature, stripeName, HeaderStripeSignature, "missing")
	}
	items := strings.Split(header, ",")
	if len(items) > maxEntries {
		return Event{}, fail(ErrMalformed, stripeName, HeaderStripeSignature, "%d elements, more than %d", len(items), maxEntries)
	}
	var rawTS string
	var hasTS bool
	var sigs [][]byte
	for i, item := range items {
		key, value, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || key == "" {
			return Event{}, fail(ErrMalformed, stripeName, HeaderStripeSignature, "element %d is not key=value", i+1)
		}
		switch key {
		case "t":
			if hasTS {
				return Event{}, fail(ErrMalformed, stripeName, HeaderStripeSignature, "more than one t= element")
			}
			rawTS, hasTS = value, true
		case "v1":
			if sig, err := hex.DecodeString(value); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	if !hasTS {
		return Event{}, fail(ErrTimestamp, stripeName, HeaderStripeSignature, "no t= element")
	}
	ts, err := parseUnix(rawTS)
	if err != nil {
		return Event{}, fail(ErrTimestamp, stripeName, HeaderStripeSignature, "t= %v", err)
	}
	if len(sigs) == 0 {
		return Event{}, fail(ErrBadSignature, stripeName, HeaderStripeSignature, "no v1 signature")
	}
	if !anyEqual(macs(p.keys, []byte(rawTS), []byte{'.'}, body), sigs) {
		return Event{}, fail(ErrBadSignature, stripeName, HeaderStripeSignature, "none of %d v1 signatures verifies", len(sigs))
	}
	if err := checkTolerance(ts, now, p.tol); err != nil {
		return Event{}, fail(ErrTimestamp, stripeName, HeaderStripeSignature, "t= %v", err)
	}
	id, err := stripeEventID(body)
	if err != nil {
		return Event{}, fail(ErrNoID, stripeName, "body", "%v", err)
	}
	return Event{ID: id, Timestamp: ts}, nil
}

// stripeEventID returns the string value of the body's top-level "id",
// matched exactly (encoding/json would match a struct field regardless of
// case).
func stripeEventID(body []byte) (string, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return "", errNotJSONObject
	}
	raw, ok := top["id"]
	if !ok {
		return "", errNoStripeID
	}
	var id string
	if err := json.Unmarshal(raw, &id); err != nil || id == "" {
		return "", errNoStripeID
	}
	return id, nil
}

var (
	errNotJSONObject = errors.New("not a JSON object")
	errNoStripeID    = errors.New(`no top-level string "id"`)
)
