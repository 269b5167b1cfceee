// Package sqs is idemq's Amazon SQS broker adapter, built on
// github.com/aws/aws-sdk-go-v2/service/sqs.
//
// A Source consumes one queue, standard or FIFO, as a driver.Puller: the
// Consumer keeps several long polls outstanding (ReceiveMessage, ten
// messages at most) within its window. The business id is the
// "message-id" message attribute (WithIDAttribute), never the SQS
// MessageId, which changes when a producer retries a send; the MessageId
// is the BrokerKey, so a message SQS hands out again while the Consumer
// holds it supersedes the older delivery. Attempt is
// ApproximateReceiveCount, Headers are the message attributes, Key is the
// MessageGroupId and System "aws_sqs".
//
// Each receive asks for a visibility timeout of its own,
// DefaultVisibilityTimeout (6s) unless the queue's is shorter
// (WithVisibilityTimeout, visibility=): the Consumer's lease, which its
// heartbeat renews (Extend, ChangeMessageVisibilityBatch) up to
// WithMaxExtension, so a live consumer keeps a message however long it
// works on it and a crashed consumer's messages come back within that
// timeout. Ack deletes by receipt handle, ten per DeleteMessageBatch;
// Retry sets the visibility to the backoff delay; Release to zero. A
// receipt handle SQS refuses makes the settlement stale: SQS may accept a
// delete with a replaced handle and keep the message, so DeadLetter
// proves the handle before it sends anything.
//
// DeadLetter sends a copy with core/driver's bookkeeping attributes
// (idemq-cause, idemq-attempt, and the source queue in idemq-origin) to
// the dead-letter queue and deletes the original (DeadLetterSend), or
// hands the message back to the queue's redrive policy
// (DeadLetterRedrive). SQS allows ten message attributes: what does not
// fit is folded into idemq-attributes (AttributeFolded), which a Source
// unfolds. OpenDeadLetters gives an operator the dead-letter queue (Scan,
// Redrive, Purge).
//
// On a FIFO queue a group's messages are handed out one at a time, in
// order: those that arrive in one receive are held back until the earlier
// one is deleted, and made visible again to come after it when it comes
// back. The Publisher sets MessageGroupId from Message.Key and the
// MessageDeduplicationId from the business id.
//
// Open, NewPublisher and OpenDeadLetters take the sqs:// URL that
// core.OpenSource, core.OpenPublisher and admin.OpenDeadLetters take (the
// package registers the scheme); options in code override its parameters:
//
//	sqs://orders?region=eu-west-1
//	sqs://KEY:SECRET@orders?endpoint=http://127.0.0.1:9324&dlq=orders-dlq
//
// The tests run against IDEMQ_SQS_URL, or the fauxqs emulator installed by
// `npm ci` in brokers/sqs/internal/fauxqs, which they start themselves.
package sqs
