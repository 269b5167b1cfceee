// Package sqs is idemq's Amazon SQS broker adapter, built on
// github.com/aws/aws-sdk-go-v2/service/sqs.
//
// A Source consumes one queue, standard or FIFO. Several receivers
// long-poll it (up to ten messages per call) and together never hold more
// received-but-unsettled messages than the Consumer's window. The business
// id is the "message-id" message attribute (WithIDAttribute), never the SQS
// MessageId, which changes when a producer retries a send. Attempt is
// ApproximateReceiveCount, Headers are the message attributes (trace
// context travels there), Key is the MessageGroupId and System "aws_sqs".
//
// Settlement:
//
//   - Ack: DeleteMessageBatch by receipt handle, ten per call
//     (driver.BatchSettler). Entries SQS fails are sent again; those that
//     still fail are reported, never dropped, and SQS redelivers them.
//   - Retry: ChangeMessageVisibility to the backoff delay (whole seconds),
//     so SQS redelivers the message with a higher receive count.
//   - DeadLetter: a copy sent to the dead-letter queue with core/driver's
//     bookkeeping attributes (idemq-cause, idemq-attempt, and the source
//     queue in idemq-origin), then the original deleted (DeadLetterSend);
//     or the message handed back to the queue's redrive policy, which moves
//     it after maxReceiveCount receives (DeadLetterRedrive).
//
// SQS allows ten message attributes. When a copy's do not fit, the
// bookkeeping, the id attribute, idemq-encoding and the trace context stay
// as they are and the rest are folded into one attribute, idemq-attributes
// (AttributeFolded), which a Source unfolds on receive: nothing is lost.
//
// OpenDeadLetters (or admin.OpenDeadLetters with the consumer's own sqs://
// URL) gives an operator the dead-letter queue: Scan, Redrive (back to the
// queue each message came from, without the bookkeeping) and Purge.
//
// A settlement of a stale delivery sends nothing and returns an error
// wrapping core.ErrStaleDelivery: after Close (ErrClosed), once the
// visibility timeout lapsed (the heartbeat off or stopped at
// WithMaxExtension), when the Source received the same message again, or
// when SQS refuses the receipt handle (ReceiptHandleIsInvalid,
// MessageNotInflight). A stale receipt handle cannot be trusted to fail:
// SQS (and fauxqs) may accept a delete with a replaced handle and keep the
// message.
//
// While a message is unsettled a heartbeat extends its visibility before it
// lapses, up to WithMaxExtension after the receipt. On a FIFO queue the
// messages of one MessageGroupId are handed out one at a time, in order:
// those of a group that arrive in one batch are held back until the earlier
// one is settled, and released to come after it when it is retried. The
// Publisher sets MessageGroupId from Message.Key and MessageDeduplicationId
// from the business id.
//
// Close makes unsettled messages visible again at once, after letting the
// long polls in progress return (up to WithCloseTimeout) so that what they
// bring is released too.
//
// Open, NewPublisher and OpenDeadLetters take the sqs:// URL that
// core.OpenSource, core.OpenPublisher and admin.OpenDeadLetters take (the
// package registers the scheme); options given in code override its
// parameters. Local emulators need an endpoint and static credentials;
// otherwise the AWS default configuration and credential chain apply:
//
//	sqs://orders?region=eu-west-1
//	sqs://KEY:SECRET@orders?endpoint=http://127.0.0.1:9324&dlq=orders-dlq
//
// A configuration problem is reported by the URL parameter (dlq,
// dead_letter_mode, …), or by the option's name when options were given
// in code.
//
// The tests run against a real SQS-protocol endpoint: IDEMQ_SQS_URL, or the
// fauxqs emulator installed by `npm ci` in brokers/sqs/internal/fauxqs,
// which the tests start on a free loopback port.
package sqs
