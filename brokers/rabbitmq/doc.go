// Package rabbitmq is idemq's RabbitMQ broker adapter, built on
// github.com/rabbitmq/amqp091-go.
//
// A Source (Open) is a driver.Puller: it consumes one queue with manual
// acknowledgements and a QoS prefetch equal to the Consumer's window; the
// message id is the message_id property or a header (WithIDHeader). A
// batch's settlements of one kind go out as one multiple ack, requeue or
// reject where the channel allows it (see Source.Ack); acks above a tag
// still unsettled wait briefly for it, so batches committed out of order
// share one multiple ack. Retry and
// DeadLetter follow the Source's RetryMode and DeadLetterMode; a parked
// copy carries the bookkeeping headers of core/driver (driver.CauseHeader
// and the others). Attempt comes from x-delivery-count on quorum queues,
// and on classic queues, which only flag a redelivery, from what this
// process requeued (core/driver/attempts).
//
// amqp091-go does not reconnect by itself (and its optional channel
// recovery reuses channel ids, so an old delivery tag could land on a new
// channel). The Source reconnects with backoff on its own and binds every
// delivery to the channel it arrived on: settling a delivery whose channel
// died returns an error wrapping driver.ErrStaleDelivery and sends nothing.
// The broker redelivers such a message, and the dedup store then decides
// Duplicate if its effect was already committed.
//
// On a cluster (its nodes listed in the URL, see Open) use quorum queues
// with a delivery limit (queue_type=quorum&delivery_limit=5): a quorum
// queue is replicated and keeps working while a minority of its nodes is
// down, whereas a classic queue lives on one node and is gone while that
// node is down.
//
// DeadLetters (OpenDeadLetters, or admin.OpenDeadLetters with the
// Source's URL) lists, redrives and purges the messages parked in the
// dead-letter queue. A Publisher publishes core Messages with publisher
// confirms, for tests, examples and the outbox relay; one URL with
// exchange= opens both sides.
package rabbitmq
