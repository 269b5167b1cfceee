// Package webhook is idemq's webhook inbox: HTTP as a broker. A Source is
// both an http.Handler, which a service mounts in its own server (or which
// Open serves), and a driver.Pusher, which a core.Consumer runs. Each POST
// whose signature verifies under a signature.Profile (Standard Webhooks,
// Stripe, GitHub, Shopify) becomes a message, and the HTTP response is its
// acknowledgement: the request waits until the Consumer settles it, so a
// 2xx goes out only after the handler's effect and the message's claim
// were committed together.
//
// A message has the provider's event id as ID (signature.Event), the raw
// body, the request's headers (names in lower case, the first value of
// each, so traceparent reaches tracing), the request path as Source,
// System "webhook", and Metadata with http.request.method, url.path,
// client.address and webhook.profile. Attempt is 1, plus the times this
// Source answered the same event 503 after a Retry (counted in memory, for
// the last 10000 events; providers send no attempt count), so the
// Consumer's maximum attempts are reached and a poison event is parked.
//
// Ack answers 200; Retry 503 with Retry-After, the delay in seconds
// rounded up; DeadLetter parks the request in a file and answers 200 (503
// if the file cannot be written); a Consumer that stops gives back what it
// holds, answered 503. A request that does not verify is answered 401 and
// never reaches the Consumer; one without an event id is parked. A copy
// of an event arriving while an earlier copy is with the Consumer waits
// for its answer (WithWait) and takes it. A request beyond the Consumer's
// window waits for room up to WithWait, and one not settled WithAnswerBy
// after it arrived is answered 503 while the Consumer goes on with it.
// docs/http.md lists every answer and the parked file's format.
//
// Importing the package registers webhook:// with core.OpenSource (Open)
// and admin.OpenDeadLetters (OpenDeadLetters), and no publisher: the
// provider sends the requests.
package webhook
