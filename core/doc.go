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
// core imports no broker client and no database driver: handlers depend on
// the store's transaction type only, so switching brokers touches no handler.
package core
