// Package effects makes effects outside the database, such as a card
// charge or an e-mail, happen once per message even when a handler runs
// again.
//
// An idemq handler's database effects commit at most once per message, but
// the handler itself can run more than once: after its transaction rolled
// back, after a crash before the commit, after a retry. A call to a payment
// or e-mail API made by such a run cannot be rolled back. Two tools close
// the gap:
//
//   - IdempotencyKey derives a key from (consumer, message id, purpose)
//     with HMAC-SHA256 and a secret: the same on every redelivery, so the
//     provider deduplicates the call (Stripe, Adyen and the IETF
//     Idempotency-Key draft accept one), and unguessable by anyone who
//     sees message ids. Transport sends it as the Idempotency-Key header
//     of requests whose context carries it (WithIdempotencyKey).
//   - Table.Remember records a call's result in an effects table keyed by
//     (consumer, message id, purpose), so a run that reaches the call again
//     reuses the stored result instead of calling out twice — also with
//     providers that do not deduplicate.
package effects
