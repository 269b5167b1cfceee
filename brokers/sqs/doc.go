// Package sqs is idemq's Amazon SQS broker adapter, built on
// github.com/aws/aws-sdk-go-v2/service/sqs.
//
// A Source consumes one queue, standard or FIFO. Several receivers
// long-poll it (WaitTimeSeconds, up to ten messages per call) and together
// never hold more received-but-unsettled messages than the Consumer's
// window (driver.WindowSetter). The business id is the "message-id" message
// attribute (WithIDAttribute; core.WithIDFunc derives one otherwise), never
// the SQS MessageId, which changes when a producer retries a send. Attempt
// is ApproximateReceiveCount, Headers are the message attributes (trace
// context travels there), Key is the MessageGroupId and System "aws_sqs".
//
// Settlement follows the idemq design:
//
//   - Ack: DeleteMessageBatch by receipt handle, ten per call
//     (driver.BatchSettler). Entries SQS fails are sent again; those that
//     still fail are reported, never dropped, and SQS redelivers them: the
//     dedup store then decides Duplicate.
//   - Retry: ChangeMessageVisibility to the backoff delay (whole seconds),
//     so SQS redelivers the message with a higher receive count.
//   - DeadLetter: a copy sent to the dead-letter queue with the cause in
//     the idemq-cause attribute (driver.CauseHeader, as on every broker),
//     the source queue in idemq-source-queue and the receive count in
//     idemq-attempt, then the original deleted (DeadLetterSend), or the
//     message handed back to the queue's redrive policy, which moves it
//     after maxReceiveCount receives (DeadLetterRedrive).
//
// SQS allows ten message attributes. When the original's attributes and
// the three above do not fit, the copy keeps the three, the id attribute,
// idemq-encoding and the trace context as they are, and folds the rest
// into one attribute, idemq-attributes, a JSON object
// ({"name":{"DataType":"String","StringValue":"…"},…}; binary values in
// base64 under "BinaryValue"). Nothing is lost, the cause is always where
// `aws sqs receive-message --message-attribute-names All` shows it, and a
// Source unfolds idemq-attributes on receive, so a message redriven from
// the dead-letter queue has all its original headers back.
//
// OpenDeadLetters (or admin.OpenDeadLetters with the consumer's own sqs://
// URL) gives an operator the dead-letter queue as DeadLetters: Scan lists
// the parked messages with their cause, attempt, origin and park time,
// Redrive sends the chosen ones back to the queue they came from without
// the idemq attributes (so their attempts start again) and deletes them
// once SQS accepted the send, and Purge deletes the chosen ones. SQS cannot
// read a message without receiving it, so each call receives the messages
// parked when it began, keeps them hidden while it runs and makes the rest
// visible again when it returns. Copies made by DeadLetterSend carry their
// cause; messages the redrive policy moved are reported as such, and when
// all of them are redriven SQS is asked to move them back itself
// (StartMessageMoveTask) where the endpoint supports it.
//
// A settlement of a stale delivery sends nothing and returns an error
// wrapping core.ErrStaleDelivery (the Consumer counts it in Stats.Stale):
// after Close (ErrClosed), once the visibility timeout lapsed (the
// heartbeat off or stopped at WithMaxExtension), when the Source received
// the same message again, or when SQS refuses the receipt handle
// (ReceiptHandleIsInvalid, MessageNotInflight). SQS redelivers the
// message, and a committed one is then decided Duplicate. A stale receipt
// handle cannot be trusted to fail: SQS (and fauxqs) may accept a delete
// with a replaced handle and keep the message.
//
// While a message is unsettled a heartbeat extends its visibility before it
// lapses (ChangeMessageVisibilityBatch), so a slow handler does not let
// another consumer receive it, up to WithMaxExtension after the receipt.
// If an extension fails and the message is received elsewhere, nothing
// breaks: its claim in the dedup store waits for the first transaction and
// the copy is decided Duplicate.
//
// On a FIFO queue the messages of one MessageGroupId are handed out one at
// a time, in order: SQS sends no more of a group while one is in flight,
// and messages of a group that arrive in one batch are held back until the
// earlier one is settled; when it is retried they are released so that SQS
// delivers them after it (a retried message blocks its group for its
// backoff delay). The Publisher sets MessageGroupId from Message.Key and
// MessageDeduplicationId from the business id.
//
// Close makes unsettled messages visible again at once. SQS may still hand
// messages to a long poll whose caller went away, so Close first lets the
// polls in progress return (up to WithCloseTimeout, default 20s, never
// longer than WithWaitTime) and releases what they bring; a shorter
// WithWaitTime makes shutdown quicker.
//
// The Source implements driver.RedeliveryHorizoner with the queue's
// MessageRetentionPeriod (or the dead-letter queue's, when longer), so the
// Consumer warns when the store prunes claims sooner.
//
// Warnings (receive errors, heartbeat failures, dead letters) go to the
// WithLogger logger, else the one given to core.OpenSource, else the
// Consumer's (driver.LoggerSetter), and until then slog.Default().
//
// Local emulators need an endpoint and static credentials (WithEndpoint,
// WithStaticCredentials); otherwise the AWS default configuration and
// credential chain apply. Importing the package registers the sqs:// URL
// scheme with core.OpenSource, core.OpenPublisher and admin.OpenDeadLetters:
//
//	sqs://orders?region=eu-west-1
//	sqs://KEY:SECRET@orders?endpoint=http://127.0.0.1:9324&dlq=orders-dlq
//
// A Source or Publisher opened by URL reports a configuration problem by
// the URL parameter (dlq, dead_letter_mode, …), one opened with options by
// the option's name.
//
// The tests run against a real SQS-protocol endpoint: IDEMQ_SQS_URL, or the
// fauxqs emulator installed by `npm ci` in brokers/sqs/internal/fauxqs,
// which the tests start on a free loopback port.
package sqs
