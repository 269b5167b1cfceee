// Package core is idemq's broker-neutral consumer pipeline.
//
// A broker adapter (package brokers/...) turns what it receives into
// Deliveries. The Consumer claims each message's business id in a database
// transaction of a Store (package stores/...), runs the user's Handler inside
// that same transaction, commits, and only then settles the delivery. A
// second delivery of the same id loses the claim and is acknowledged without
// running the handler. Every message ends in exactly one of four decisions:
// Processed, Duplicate, Retry or DeadLetter.
//
// A store that stops answering does not turn the messages in flight into
// Retries, which would spend the broker's delivery count (and park healthy
// messages under a delivery limit): the Consumer pauses, holding them and
// taking no new ones, pings the store with backoff, and runs the held
// transactions again when it answers (WithStoreProbe,
// WithTransactionTimeout).
//
// An effect outside the database that is slow or can hang (a payment API)
// would hold the transaction and its connection for the whole call.
// NewLeased decides such messages in steps instead: a short transaction
// claims the id in progress under a lease with a fencing token, the call
// runs outside any transaction while the lease is renewed, and one
// transaction completes the claim if the token still holds it.
//
// core imports no broker client and no database driver: handlers depend on
// the store's transaction type only, so switching brokers touches no handler.
package core
