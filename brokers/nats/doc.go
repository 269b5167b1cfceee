// Package nats is idemq's NATS JetStream broker adapter, built on
// github.com/nats-io/nats.go and its jetstream package. Importing it
// registers the nats:// scheme with core.OpenSource, core.OpenPublisher and
// admin.OpenDeadLetters; Open, NewPublisher and OpenDeadLetters take the
// same URL, and options given in code override its parameters:
//
//	nats://[user:pass@]host:4222[,host2:4222]/STREAM?consumer=NAME&subject=…
//
// The path is the stream. docs/brokers.md lists every parameter, the
// message's fields and the limits. A token goes in the token parameter,
// never the URL's user part, where logs would show it; errors never show a
// password, token or seed.
//
// A Source consumes the stream through a durable pull consumer with
// explicit acks and no MaxDeliver: idemq decides when a message is poison.
// With declare=true, the default, Open creates the stream and the
// dead-letter stream when they are missing and creates or updates the
// consumer; an existing stream is never changed, but for a shared
// dead-letter stream gaining the consumer's dead-letter subject.
//
// The business id is the idemq-id header when present, otherwise
// Nats-Msg-Id (or the id_header): the id JetStream itself uses to drop a
// second publish within the stream's duplicate window.
//
// Settlement: Ack is a double ack, confirmed by the server; AckBatch sends
// plain acks and one flush, whose answer confirms them all. Retry is
// NakWithDelay. DeadLetter publishes a copy with the bookkeeping headers to
// the dead-letter subject (idemq.dlq.<STREAM>.<CONSUMER> in <STREAM>_DLQ)
// and terminates the original once JetStream acked the copy; a failed
// publish gives the message back. While a delivery is unsettled, a
// heartbeat sends InProgress every third of the AckWait, up to
// max_extension after the receipt. A settlement sends nothing and wraps
// core.ErrStaleDelivery after Close (which gives unsettled deliveries and
// the pull buffer back), once the AckWait passed without a confirmed
// heartbeat, and once the Source received the message again. A reconnect
// alone makes nothing stale: JetStream keeps the consumer on the server.
//
// DeadLetters reads the dead-letter stream by sequence with direct gets,
// so listing leaves the copies parked. Redrive publishes a copy to the
// subject it was consumed from with the id in idemq-id and a Nats-Msg-Id
// of its own (JetStream would drop the original's within the duplicate
// window), then deletes it by sequence.
//
// The server must be 2.9 or later (NakWithDelay, next-by-subject gets).
package nats
