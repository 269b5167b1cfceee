// Package memory is idemq's embedded, in-process at-least-once broker: the
// default broker for tests, the quickstart and benchmarks, with no service to
// run.
//
// It behaves like a real at-least-once broker rather than a perfect one:
//
//   - A delivery is a lease. A delivery that is not settled within the
//     visibility timeout (WithVisibilityTimeout or the mem:// URL's
//     visibility parameter, default 30s) is redelivered, possibly to
//     another subscription while the first one still works on it, exactly
//     as SQS does; concurrent duplicates are therefore normal.
//   - Attempt counts deliveries: 1 on the first, +1 on every redelivery
//     (Retry, visibility expiry, crash or close of the subscription holding
//     it, Release). Redrive starts a dead letter again at attempt 1.
//   - Subscription.Crash simulates a consumer process dying: everything it
//     holds goes back to the queue at once and its later settlements fail.
//   - Faults (SetFaults) inject lost acks, crashes between commit and ack, and
//     duplicate publishes (a producer retry), drawn from pseudo-random
//     sources seeded with WithSeed. Each queue has one source for publishes
//     and one for acks, so the same publishes always get the same
//     duplicates, and one consumer settling in the same order always meets
//     the same faults; with concurrent consumers the interleaving, and so
//     which ack draws which fault, depends on scheduling, while the rates
//     hold.
//
// A Subscription is a driver.Puller and a driver.Releaser: a Consumer
// (core.New) drives it, and tests may call its methods directly; each
// settlement settles a whole call's messages at once. The Consumer owns
// the window, settling each message once and telling stale deliveries
// apart; the broker's own rule is that only the current lease of a
// message settles it: a settlement of a delivery whose lease ended
// returns ErrLeaseExpired and changes nothing, so a stale ack never
// acknowledges a newer copy (stricter than SQS, which may accept an old
// receipt handle). The redelivered copy loses its claim and is
// acknowledged as a Duplicate. When only some messages of a call fail, a
// *driver.Partial says which.
//
// Leases are not extended: the Subscription is no driver.Extender, and
// Start reports the visibility timeout as Traits.Lease, so a Consumer
// that holds a message longer than that finds its settlement stale while
// the message is redelivered. Choose a visibility timeout longer than a
// message's handling.
//
// Messages are delivered in FIFO order per queue, without per-key ordering
// (like an SQS standard queue). Requeued messages go to the front, retried
// and expired ones to the back. Several subscriptions may share a queue;
// blocked receivers are served first come, first served.
//
// The broker starts no goroutine of its own: delayed retries and lease
// expiries are kept in a heap per queue with one time.AfterFunc timer, and
// Close stops them.
package memory
