// Package memory is idemq's embedded, in-process at-least-once broker: the
// default broker for tests, the quickstart and benchmarks, with no service to
// run.
//
// It behaves like a real at-least-once broker rather than a perfect one:
//
//   - A delivery is a lease. A delivery that is not settled within the
//     visibility timeout (WithVisibilityTimeout, default 30s) is redelivered,
//     possibly to another subscription while the first one still works on it,
//     exactly as SQS does; concurrent duplicates are therefore normal.
//   - Attempt counts deliveries: 1 on the first, +1 on every redelivery
//     (Retry, visibility expiry, crash or close of the subscription holding
//     it). Redrive starts a dead letter again at attempt 1.
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
// Settlement rules (see Delivery): each delivery is settled at most once; a
// second settlement returns driver.ErrAlreadySettled. A settlement of a delivery
// whose lease expired returns ErrLeaseExpired and changes nothing: a stale
// ack never acknowledges a newer copy of the message that is still being
// decided, nor one waiting to be redelivered. This is stricter than SQS,
// which may accept an old receipt handle, and it is what the pipeline
// needs: the redelivered copy loses its claim and is acknowledged as a
// Duplicate. Settlements after Subscription.Crash return ErrCrashed, after
// Subscription.Close ErrSubscriptionClosed, both wrapping
// core.ErrStaleDelivery too (the messages were already requeued, as an ack
// on a closed AMQP channel cannot reach the broker).
//
// A subscription's window (WithWindow, SetWindow; unlimited until set)
// counts deliveries the consumer has not settled. An expired delivery keeps
// its slot until the consumer settles it, even though that settlement is
// refused, so the consumer never holds more than its window.
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
