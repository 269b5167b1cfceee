// Package rabbitmq is idemq's RabbitMQ broker adapter, built on
// github.com/rabbitmq/amqp091-go.
//
// A Source consumes one queue with manual acknowledgements and a QoS
// prefetch equal to the Consumer's in-flight window. The message id is the
// AMQP message_id property or, with WithIDHeader (URL parameter id_header),
// a header for producers that cannot set message_id (amqp-publish,
// NServiceBus, MassTransit), falling back to message_id when the header is
// absent. With WithExchange (URL parameter exchange) the queue is bound to
// the exchange producers publish to, so one URL opens both sides.
// Settlement follows the idemq design:
//
//   - Ack: basic.ack by delivery tag. AckBatch uses one multiple=true ack
//     only over a run of tags where every lower outstanding tag of the
//     channel is in the batch (a multiple ack acknowledges every unacked tag
//     up to it, including deliveries still in flight), and acks the rest one
//     by one.
//   - Retry: nack with requeue after the delay (RetryRequeue), or a copy
//     published to a retry queue whose per-message TTL dead-letters it back
//     to the main queue (RetryViaQueue).
//   - DeadLetter: a copy published to the dead-letter queue with the cause in
//     the idemq-cause header (driver.CauseHeader, the same on every broker),
//     confirmed, then acked (DeadLetterRepublish), or basic.reject without
//     requeue into the queue's dead-letter exchange (DeadLetterReject).
//
// amqp091-go does not reconnect by itself (and its optional channel
// recovery reuses channel ids, so an old delivery tag could land on a new
// channel). The Source reconnects with backoff on its own and binds every
// delivery to the channel it arrived on: settling a delivery whose channel
// died returns an error wrapping core.ErrStaleDelivery and sends nothing. The
// broker redelivers such a message, and the dedup store then decides
// Duplicate if its effect was already committed.
//
// # Clusters
//
// A URL names one node, or the nodes of a cluster as a comma-separated
// host:port list where the host goes, for amqp:// and amqps:// alike:
//
//	amqp://user:pass@h1:5672,h2:5672,h3:5672/vhost?queue=payments&queue_type=quorum&delivery_limit=5
//
// Each node gets the same user, password, vhost and parameters (with
// amqps:// each node's certificate is checked against its own host name).
// A Source or Publisher connects first to a node picked at random, so that
// many clients spread over the cluster; when a dial fails it tries the
// next node of the list at once, and after a connection loss it starts
// with the node after the one it lost. Only when every node failed in turn
// does the Source wait out its reconnect backoff (WithReconnectBackoff:
// 100ms doubling up to 2s, starting over once it consumes again). An empty
// entry in the list or a port that is not a number fails Open, naming the
// entry; passwords never appear in errors or logs.
//
// Use quorum queues on a cluster (queue_type=quorum, WithQueueType(Quorum)),
// with a delivery limit (delivery_limit=, WithDeliveryLimit): a quorum queue
// is replicated and keeps working while a minority of its nodes is down,
// whereas a classic queue lives on one node and is gone while that node
// is down.
//
// # Dead-letter queue
//
// DeadLetters (OpenDeadLetters, or admin.OpenDeadLetters with the Source's
// own URL) lets an operator list the messages parked in a consumer's
// dead-letter queue with their cause, attempt, origin and parking time,
// publish chosen ones back to the queue they came from once the fault is
// fixed (without the cause and attempt headers, so they start over as
// first attempts; the parked copy is removed only after the broker
// confirmed the publish), and delete chosen ones. A copy the Source
// republished carries its cause, attempt, origin and parking time in
// headers (driver.CauseHeader, AttemptHeader, OriginHeader,
// DestinationHeader, ParkedAtHeader); for one the broker dead-lettered itself
// (DeadLetterReject, a delivery limit, a TTL) they come from its x-death
// header, which records no cause and no attempt. AMQP cannot read a
// message without taking it: each call takes the messages parked when it
// began with basic.get, acks those it removes and returns the others to
// the queue, unacknowledged, when it ends, so the broker holds every
// message of the queue on the call's channel while the call runs.
//
// A Publisher publishes core Messages with publisher confirms, for tests,
// examples and the outbox relay.
package rabbitmq
