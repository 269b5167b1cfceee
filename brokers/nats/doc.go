// Package nats is idemq's NATS JetStream broker adapter, built on
// github.com/nats-io/nats.go and its jetstream package.
//
// A Source consumes a stream through a durable pull consumer with explicit
// acks (AckPolicy explicit, MaxDeliver unlimited: idemq decides when a
// message is poison). With WithDeclare(true), the default, Open creates the
// stream (file storage, on the subject) and the dead-letter stream when
// they are missing and creates or updates the consumer; with false all
// three must exist, and Open fails naming the one that does not. An
// existing stream is never changed, apart from a shared dead-letter stream
// gaining the consumer's dead-letter subject.
//
// The business id is the Nats-Msg-Id header (WithIDHeader names another;
// core.WithIDFunc derives one otherwise), the id JetStream itself uses to
// drop a second publish within the stream's duplicate window. The
// idemq-id header, when present, takes precedence: Redrive puts the id
// there (see below), and a producer that wants every copy delivered can
// use it. A message without an id is dead-lettered by the Consumer.
// Attempt is the delivery's NumDelivered, Headers are the NATS headers
// (the first value of each; trace context travels there), Key is the
// idemq-key header, Source the subject and System "nats". Metadata holds
// messaging.destination.name (the subject), messaging.consumer.group.name
// (the consumer), messaging.message.id (Nats-Msg-Id),
// messaging.nats.stream, messaging.nats.stream_sequence and
// messaging.nats.consumer_sequence.
//
// Settlement:
//
//   - Ack: a double ack (AckSync), which waits for the server to confirm
//     it: a plain ack lost with a connection would go unreported. AckBatch
//     (driver.BatchSettler) sends the batch's plain acks and then one
//     flush, whose answer confirms the server read them all: one round
//     trip per batch. JetStream has no multiple ack for explicit-ack
//     consumers (AckAll would take unsettled messages between).
//   - Retry: NakWithDelay with the backoff delay; JetStream redelivers with
//     a higher NumDelivered.
//   - DeadLetter: a copy published to the dead-letter subject (default
//     idemq.dlq.<STREAM>.<CONSUMER>, in the stream <STREAM>_DLQ) with the
//     cause in idemq-cause (driver.CauseHeader, as on every broker), the
//     attempt in idemq-attempt, stream/consumer/sequence in idemq-origin,
//     the parking time in idemq-parked-at, the subject in idemq-subject and
//     the id in idemq-id; once JetStream acked the publish, the original is
//     terminated (Term). If the publish fails the message is given back
//     (Nak), never dropped. The copy's Nats-Msg-Id is derived from the
//     original's stream sequence, so a message parked twice (its Term lost)
//     is kept once.
//
// While a delivery is unsettled a heartbeat sends InProgress every third of
// the consumer's AckWait, so a slow handler keeps its lease, up to
// WithMaxExtension after the receipt; then JetStream redelivers it and the
// dedup store decides the copy Duplicate. The consumer's MaxAckPending is
// the Consumer's window (driver.WindowSetter), as is the pull buffer. The
// redelivery horizon (driver.RedeliveryHorizoner) is the stream's MaxAge
// plus the dead-letter stream's, driver.Unbounded when either has none.
//
// A settlement of a stale delivery sends nothing and returns an error
// wrapping core.ErrStaleDelivery: after Close, which gives unsettled
// deliveries and the pull buffer back to JetStream (a Nak with a 200ms
// delay, so that the closed source's pull requests are gone when they are
// redelivered), once the AckWait passed without a confirmed heartbeat,
// when JetStream redelivers the message, and once the Source received the
// message again (the newer delivery settles it). A reconnect by itself
// does not make a delivery stale: JetStream keeps the consumer's state on
// the server, and acks sent after the reconnect still count.
//
// OpenDeadLetters (or admin.OpenDeadLetters with the consumer's own nats://
// URL) gives an operator the consumer's dead letters: Scan reads them by
// stream sequence (direct gets, never a consumer, so listing leaves them
// parked), Ref is the dead-letter stream sequence, Redrive publishes the
// chosen ones to the subject they were consumed from without the
// bookkeeping headers and deletes them by sequence once JetStream acked the
// publish, Purge deletes them. JetStream would drop a redriven copy whose
// Nats-Msg-Id it saw within the duplicate window, so the copy carries the
// business id in idemq-id and a Nats-Msg-Id of its own (from its
// dead-letter sequence: a Redrive repeated after a failed delete is
// dropped). Every consumer of the subject gets the redriven copy; those
// that applied it decide it Duplicate.
//
// Importing the package registers the nats:// URL scheme with
// core.OpenSource, core.OpenPublisher and admin.OpenDeadLetters:
//
//	nats://[user:pass@]host:4222[,host2:4222]/STREAM?consumer=NAME&subject=…
//
// The path is the stream. Parameters, each refused by name when unknown or
// when its value is bad:
//
//	parameter      option                   default
//	consumer       WithConsumer             none; required by the Source and dead letters
//	subject        WithSubject              the stream's name
//	declare        WithDeclare              true
//	id_header      WithIDHeader             Nats-Msg-Id
//	ack_wait       WithAckWait              30s (a declared consumer's AckWait)
//	heartbeat      WithHeartbeat            true
//	max_extension  WithMaxExtension         1h
//	window         WithWindow               100 (MaxAckPending; the Consumer sets its own)
//	dlq_stream     WithDeadLetterStream     <STREAM>_DLQ
//	dlq_subject    WithDeadLetterSubject    idemq.dlq.<STREAM>.<CONSUMER>
//	token          nats.Token               none
//	tls            nats.Secure              false; true requires TLS, verified with the system roots
//	tls_ca         nats.RootCAs             none: a PEM file of CAs to trust (implies TLS)
//	tls_cert       nats.ClientCert          none: a client certificate PEM file, with tls_key
//	tls_key        nats.ClientCert          none: its key's PEM file, with tls_cert
//	nkey_seed      nats.NkeyOptionFromSeed  none: a file holding a user nkey seed
//	creds          nats.UserCredentials     none: a .creds file (user JWT and seed)
//
// User and password come from the URL's user part; a token goes in the
// token parameter, never the user part, where logs would show it. Errors
// never show the password, token or seed.
//
// Limits: the streams the adapter declares have no age or size limit
// (set them on the server; the horizon follows). Headers carry one value
// each as the adapter reads them. A message that a pull request in flight
// brings after Close comes back only when its AckWait passes. A message
// that waits in the pull buffer longer than the AckWait is redelivered
// (and decided Duplicate if it was applied). The server must be 2.9 or
// later (NakWithDelay, next-by-subject message gets).
//
// The tests run against a real nats-server with JetStream: IDEMQ_NATS_URL
// (default nats://127.0.0.1:4222), and private servers started from
// /usr/sbin/nats-server for restarts and security modes.
package nats
