// Package webhook is idemq's webhook inbox: HTTP as a broker. A Source is
// both an http.Handler, which a service mounts in its own server (or which
// Open serves), and a driver.Source, which a core.Consumer takes. Each
// POST whose signature verifies under a signature.Profile (Standard
// Webhooks, Stripe, GitHub, Shopify) becomes a delivery, and the HTTP
// response is its acknowledgement: the request waits until the Consumer
// settles it, so a 2xx goes out only after the handler's effect and the
// message's claim were committed together.
//
// A delivery's Message has the provider's event id as ID (signature.Event),
// the raw body, the request's headers (names in lower case, the first value
// of each, so traceparent reaches tracing), the request path as Source,
// System "webhook", and Metadata with http.request.method, url.path,
// client.address and webhook.profile. Attempt is 1, plus the times this
// Source answered the same event 503 after a Retry (counted in memory, for
// the last 10000 events; providers send no attempt count), so the
// Consumer's maximum attempts are reached and a poison event is parked.
//
// The answers:
//
//   - Ack (Processed or Duplicate): 200.
//   - Retry(delay): 503 with Retry-After, delay in seconds rounded up, at
//     least 1. The provider sends the event again on its own schedule.
//   - DeadLetter(cause): the request is parked (below) and answered 200,
//     since a 4xx would make providers retry or disable the endpoint; if the
//     file cannot be written, 503 and the provider sends it again.
//   - A missing, malformed or wrong signature, or a timestamp outside the
//     tolerance: 401, logged; the request never reaches the Consumer or the
//     store. The body of the answer names the check that failed, no more.
//   - A verified request without an event id (signature.ErrNoID): parked
//     with the reason and answered 200: never processed, never dropped.
//   - A body over WithMaxBody (1 MiB by default): 413, read no further. A
//     body that cannot be read in full: 400. A method other than POST: 405.
//   - A copy of an event arriving while an earlier copy is queued or with
//     the Consumer waits for the earlier one's answer, up to WithWait, and
//     takes the same answer (200 once the first is acknowledged, without a
//     second delivery); past the bound, 409 with Retry-After. Copies are
//     never handed to the Consumer concurrently.
//   - Back-pressure: a request waits up to WithWait for the Consumer to
//     take it (Receive; the Consumer's window bounds how many are out),
//     then 503 with Retry-After.
//   - A request the Consumer has not settled WithAnswerBy after its arrival
//     (a slow handler, a leased effect's external call): 503 with
//     Retry-After, while the Consumer goes on with it. Its effect commits
//     once; the sender's next copy waits for that settlement (then 200),
//     or arrives after it and is a Duplicate (200). With a leased Consumer
//     (core.NewLeased) and several replicas behind one endpoint, a copy
//     reaching another replica while the lease is live is retried by the
//     Consumer: 503 with Retry-After.
//   - After Close: 503 with Retry-After, for new requests and for those
//     waiting to be taken. A request already with the Consumer waits up to
//     WithWait for its settlement, then gets 503 and its settlement is
//     stale (driver.ErrStaleDelivery).
//
// WithWait defaults to 4 s (DefaultWait) and WithAnswerBy to 4.5 s
// (DefaultAnswerBy): below the 5 s Shopify and the 10 s GitHub wait for
// an answer, so the sender reads the 409 or 503 rather than timing out. A
// sender that leaves before the answer (its timeout, a dropped connection)
// changes nothing: the delivery is settled all the same, its effect
// committed or not, and the sender's next copy is a Duplicate or a new
// try.
//
// # Redelivery horizon
//
// A provider retries an event for a while (Standard Webhooks about 28 h,
// Stripe 3 days, Shopify 4 h; GitHub redelivers on request for 3 days);
// a copy that arrives after the store pruned the event's claim would be
// applied again. The Source reports that window to the Consumer
// (driver.RedeliveryHorizoner), which warns at start-up, or refuses to
// start under core.WithStrictRetention, when the store's retention is
// shorter. WithHorizon (horizon=) sets it where the default does not fit,
// for resends asked for later in the provider's dashboard.
//
// # Parking
//
// A parked request is one JSON file in the park directory (WithParkDir,
// park_dir=; required, checked writable at start-up), written under a
// temporary name, synced and renamed, mode 0600, named
// 20060102T150405.000000000Z-<16 hex digits>.json after the time it was
// parked, so names sort by time. Its fields are those of ParkedRequest:
//
//	{
//	  "version": 1,
//	  "id": "evt_1",                      // "" when the request had none
//	  "cause": "…",                       // why, on one line
//	  "attempt": 1,
//	  "profile": "stripe",
//	  "method": "POST",
//	  "path": "/hooks/stripe",
//	  "remote_addr": "203.0.113.7:51234",
//	  "received_at": "2026-01-02T15:04:05.123456789Z",
//	  "parked_at": "2026-01-02T15:04:05.2Z",
//	  "headers": {"Stripe-Signature": ["t=…,v1=…"], …},  // every value
//	  "body": "eyJpZCI6ImV2dF8xIn0="      // base64 of the raw body
//	}
//
// Headers hold whatever the sender sent, credentials in an Authorization
// header included: keep the directory as private as the secrets.
//
// admin.OpenDeadLetters (idemq dlq) opens the park directory of a
// webhook:// URL (DeadLetters): it lists the parked requests and purges
// them. It cannot redrive them (ErrNoRedrive): only the provider can send
// a copy that verifies, so ask it to resend the event, then purge.
//
// # Replays
//
// Standard Webhooks and Stripe sign the event id and a timestamp, so a
// copy is accepted only within the tolerance and its id is authentic.
// GitHub and Shopify sign only the body: their id headers are not signed
// (see package signature), so whoever holds one genuine request can send
// its body again under another id, and the inbox takes it as a new event.
// Where that matters, restrict who can reach the endpoint, or give the
// Consumer an id taken from the body (core.WithIDFunc).
//
// # Opening by URL
//
// Importing the package registers webhook:// with core.OpenSource and
// admin.OpenDeadLetters:
//
//	webhook://127.0.0.1:8080/hooks/stripe?verify=stripe&secret_file=/run/secrets/stripe&park_dir=/var/lib/app/parked
//
// starts an HTTP server on 127.0.0.1:8080 serving the Source at
// /hooks/stripe (Open); the Source's Close shuts it down. Parameters:
// verify (standard, stripe, github or shopify; required), secret_file (a
// file holding one secret a line; several for a rotation) or secret_env
// (an environment variable holding them the same way), tolerance
// (signature.WithTolerance), max_body (bytes), wait, answer_by, horizon,
// and park_dir (required). A bad parameter fails Open, named, its value
// never shown but for park_dir's path, which is no secret and which the
// operator must create.
// core.OpenPublisher refuses the scheme (ErrNoPublisher).
package webhook
