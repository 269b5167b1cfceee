// Package rabbitmq is idemq's RabbitMQ broker adapter, built on
// github.com/rabbitmq/amqp091-go.
//
// A Source (Open) consumes one queue with manual acknowledgements and a
// QoS prefetch equal to the Consumer's in-flight window. The message id is
// the AMQP message_id property or, with WithIDHeader, a header for
// producers that cannot set message_id. With WithExchange the queue is
// bound to the exchange producers publish to, so one URL opens both sides.
// Settlement:
//
//   - Ack: basic.ack by delivery tag. AckBatch uses one multiple=true ack
//     only over a run of tags where every lower unsettled tag of the
//     channel is in the batch (a multiple ack acknowledges every unacked tag
//     up to it, including deliveries still in flight), and acks the rest one
//     by one.
//   - Retry: nack with requeue after the delay (RetryRequeue), or a copy
//     published to a retry queue whose per-message TTL dead-letters it back
//     to the main queue (RetryViaQueue).
//   - DeadLetter: a copy published to the dead-letter queue with the
//     bookkeeping headers of core/driver (driver.CauseHeader, AttemptHeader,
//     OriginHeader, DestinationHeader, ParkedAtHeader), confirmed, then
//     acked (DeadLetterRepublish), or basic.reject without requeue into the
//     queue's dead-letter exchange (DeadLetterReject).
//
// amqp091-go does not reconnect by itself (and its optional channel
// recovery reuses channel ids, so an old delivery tag could land on a new
// channel). The Source reconnects with backoff on its own and binds every
// delivery to the channel it arrived on: settling a delivery whose channel
// died returns an error wrapping core.ErrStaleDelivery and sends nothing.
// The broker redelivers such a message, and the dedup store then decides
// Duplicate if its effect was already committed.
//
// On a cluster (its nodes listed in the URL, see Open) use quorum queues
// with a delivery limit (queue_type=quorum&delivery_limit=5): a quorum
// queue is replicated and keeps working while a minority of its nodes is
// down, whereas a classic queue lives on one node and is gone while that
// node is down.
//
// DeadLetters (OpenDeadLetters, or admin.OpenDeadLetters with the Source's
// URL) lists, redrives and purges the messages parked in the dead-letter
// queue. A Publisher publishes core Messages with publisher confirms, for
// tests, examples and the outbox relay.
package rabbitmq
