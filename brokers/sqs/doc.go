// Package sqs is idemq's Amazon SQS broker adapter, built on
// github.com/aws/aws-sdk-go-v2/service/sqs.
//
// A Source consumes one queue, standard or FIFO. Several receivers
// long-poll it and together never hold more unsettled messages than the
// Consumer's window. The business id is the "message-id" message attribute
// (WithIDAttribute), never the SQS MessageId, which changes when a producer
// retries a send. Attempt is ApproximateReceiveCount, Headers are the
// message attributes, Key is the MessageGroupId and System "aws_sqs".
//
// Ack deletes by receipt handle, ten per DeleteMessageBatch; entries that
// still fail after retries are reported, and SQS redelivers them. Retry
// sets the visibility to the backoff delay. DeadLetter sends a copy with
// core/driver's bookkeeping attributes (idemq-cause, idemq-attempt, and
// the source queue in idemq-origin) to the dead-letter queue and deletes
// the original (DeadLetterSend), or hands the message back to the queue's
// redrive policy (DeadLetterRedrive). SQS allows ten message attributes:
// what does not fit is folded into idemq-attributes (AttributeFolded),
// which a Source unfolds. OpenDeadLetters gives an operator the dead-letter
// queue (Scan, Redrive, Purge).
//
// A settlement of a stale delivery sends nothing and returns an error
// wrapping core.ErrStaleDelivery: after Close (ErrClosed), once the
// visibility lapsed, when the Source received the message again, or when
// SQS refuses the receipt handle. A stale handle cannot be trusted to
// fail: SQS may accept a delete with a replaced handle and keep the
// message. Each receive asks for a visibility timeout of its own,
// DefaultVisibilityTimeout (6s) unless the queue's is shorter
// (WithVisibilityTimeout, visibility=), and while a message is unsettled a
// heartbeat extends its visibility, up to WithMaxExtension after the
// receipt: a live consumer keeps a message however long it works on it,
// and a crashed consumer's messages come back within that timeout.
//
// On a FIFO queue a group's messages are handed out one at a time, in
// order: those that arrive in one batch are held back until the earlier
// one is settled, and released to come after it when it is retried. The
// Publisher sets MessageGroupId from Message.Key and the
// MessageDeduplicationId from the business id.
//
// Open, NewPublisher and OpenDeadLetters take the sqs:// URL that
// core.OpenSource, core.OpenPublisher and admin.OpenDeadLetters take (the
// package registers the scheme); options in code override its parameters.
// Emulators need an endpoint and static credentials; otherwise the AWS
// default configuration and credential chain apply:
//
//	sqs://orders?region=eu-west-1
//	sqs://KEY:SECRET@orders?endpoint=http://127.0.0.1:9324&dlq=orders-dlq
//
// The tests run against IDEMQ_SQS_URL, or the fauxqs emulator installed by
// `npm ci` in brokers/sqs/internal/fauxqs, which they start themselves.
package sqs
