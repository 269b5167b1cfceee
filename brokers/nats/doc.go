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
// A Source pulls from a durable consumer with explicit acks and no
// MaxDeliver (idemq decides when a message is poison), whose
// MaxAckPending is the Consumer's window. With declare=true, the default,
// Open creates the stream and the dead-letter stream when they are missing
// and creates or updates the consumer; an existing stream is never
// changed, but for a shared dead-letter stream gaining the consumer's
// dead-letter subject. The business id is the idemq-id header when
// present, otherwise Nats-Msg-Id (or the id_header). Each method says
// which JetStream call it makes.
//
// The server must be 2.9 or later (NakWithDelay, next-by-subject gets).
package nats
