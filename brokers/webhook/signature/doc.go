// Package signature verifies signed webhook requests: Standard Webhooks
// (Svix), Stripe, GitHub and Shopify, each as its provider documents it.
// A Profile checks one request's headers and raw body and returns the
// provider's event id, the id under which the webhook inbox records the
// message, so a redelivery of the same event is a duplicate.
//
// Verify checks, in this order: the signature header is present
// (ErrNoSignature) and parses (ErrMalformed); the signed timestamp is
// present and well formed (ErrTimestamp); a signature matches under one of
// the secrets (ErrBadSignature); the timestamp lies within the tolerance
// of now (ErrTimestamp); the event id is present (ErrNoID). An ErrNoID
// therefore always comes from a genuinely signed request. Errors wrap these
// sentinels with the profile and the header at fault, and never show a
// secret or a signature.
//
// Every profile takes several secrets at once, for rotation: a request
// passes when any of its signatures verifies under any secret. HMACs are
// compared with hmac.Equal and ed25519 signatures checked with
// ed25519.Verify. A header carrying more than 16 signature entries is
// malformed, which bounds the work one request can cause.
//
// What each signature covers differs, and with it the protection against
// replays:
//
//   - Standard Webhooks signs webhook-id, webhook-timestamp and the body:
//     the id and the time are authentic.
//   - Stripe signs its timestamp and the body, and the event id is the
//     body's top-level "id": both are authentic.
//   - GitHub signs the body only and sends no timestamp; the delivery id
//     (X-GitHub-Delivery) is not signed.
//   - Shopify signs the body only; the event id (X-Shopify-Event-Id, else
//     X-Shopify-Webhook-Id) and X-Shopify-Triggered-At are not signed.
//
// For GitHub and Shopify, whoever holds one genuine request can therefore
// resend its body under another id, and the inbox counts it as a new
// event; restrict who can reach the endpoint (or deduplicate on a field of
// the body) where that matters.
//
// Headers are read with http.Header.Get, so the header must be in the
// canonical form net/http builds for a request: names match whatever
// their case on the wire. The body is the exact bytes received; Verify
// reads nothing beyond it and sets no size limit of its own.
package signature
