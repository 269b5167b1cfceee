package signature

import (
	"encoding/base64"
	"net/http"
	"time"
)

const shopifyName = "shopify"

// The headers of a Shopify webhook delivery.
const (
	// HeaderShopifyHmac carries the base64 HMAC-SHA256 of the body.
	HeaderShopifyHmac = "X-Shopify-Hmac-Sha256"
	// HeaderShopifyEventID carries the event id, the same on every retry
	// of a delivery; it is not signed.
	HeaderShopifyEventID = "X-Shopify-Event-Id"
	// HeaderShopifyWebhookID carries the delivery's id, the event id when
	// X-Shopify-Event-Id is absent; it is not signed.
	HeaderShopifyWebhookID = "X-Shopify-Webhook-Id"
	// HeaderShopifyTriggeredAt carries the RFC 3339 time the event fired;
	// it is not signed.
	HeaderShopifyTriggeredAt = "X-Shopify-Triggered-At"
)

type shopify struct {
	keys  [][]byte
	tol   time.Duration
	check bool
}

// Shopify returns the profile of Shopify's webhook deliveries: the
// X-Shopify-Hmac-Sha256 header holds the base64 HMAC-SHA256 of the body
// under the app's client secret (or the store's webhook signing key), used
// as it is. The event id is X-Shopify-Event-Id, else X-Shopify-Webhook-Id.
// X-Shopify-Triggered-At, when present and well formed, is the event's
// Timestamp; only with WithTolerance is it checked, and then a malformed
// one or one outside the tolerance fails with ErrTimestamp.
func Shopify(secrets []string, opts ...Option) (Profile, error) {
	c, err := newConfig(shopifyName, secrets, opts)
	if err != nil {
		return nil, err
	}
	return &shopify{keys: rawKeys(secrets), tol: c.tolerance, check: c.toleranceSet}, nil
}

func (*shopify) Name() string { return shopifyName }

func (p *shopify) Verify(h http.Header, body []byte, now time.Time) (Event, error) {
	header := h.Get(HeaderShopifyHmac)
	if header == "" {
		return Event{}, fail(ErrNoSignature, shopifyName, HeaderShopifyHmac, "missing")
	}
	sig, err := base64.StdEncoding.Strict().DecodeString(header)
	if err != nil {
		return Event{}, fail(ErrMalformed, shopifyName, HeaderShopifyHmac, "not base64")
	}
	if !anyEqual(macs(p.keys, body), [][]byte{sig}) {
		return Event{}, fail(ErrBadSignature, shopifyName, HeaderShopifyHmac, "does not verify")
	}
	var ts time.Time
	if raw := h.Get(HeaderShopifyTriggeredAt); raw != "" {
		t, err := time.Parse(time.RFC3339, raw)
		switch {
		case err != nil && p.check:
			return Event{}, fail(ErrTimestamp, shopifyName, HeaderShopifyTriggeredAt, "not an RFC 3339 time")
		case err == nil:
			ts = t
			if p.check {
				if err := checkTolerance(t, now, p.tol); err != nil {
					return Event{}, fail(ErrTimestamp, shopifyName, HeaderShopifyTriggeredAt, "%v", err)
				}
			}
		}
	}
	id := h.Get(HeaderShopifyEventID)
	if id == "" {
		id = h.Get(HeaderShopifyWebhookID)
	}
	if id == "" {
		return Event{}, fail(ErrNoID, shopifyName, HeaderShopifyEventID, "missing, and so is %s", HeaderShopifyWebhookID)
	}
	return Event{ID: id, Timestamp: ts}, nil
}
