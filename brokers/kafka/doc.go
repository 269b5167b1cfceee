// Package kafka is idemq's Kafka broker adapter, built on
// github.com/segmentio/kafka-go.
//
// A Source consumes one topic as a member of a consumer group. It uses
// kafka-go's ConsumerGroup/Generation API rather than a group Reader,
// because the Reader hides partition assignment: the Source needs to know
// when partitions are revoked to settle and commit before releasing them.
// Each generation's partitions are fetched by per-partition readers from
// the committed offsets.
//
// On Kafka the "ack" is an offset commit, and it covers every earlier
// offset of the partition. The Source turns that into idemq's per-message
// settlement:
//
//   - Ack marks a message done. The committed offset of a partition only
//     advances over the contiguous prefix of decided messages, so a message
//     still in flight (or waiting for a retry) is never skipped, whatever
//     order messages complete in. Commits are batched: every
//     WithCommit interval (default 1s) or after that many decided messages
//     (default 1000), and flushed when partitions are revoked and on Close.
//     The commit's metadata string also records which offsets above the
//     committed one are already decided, so the next owner skips them
//     instead of redelivering them (see Stats.Skipped).
//   - Retry puts the message back in place: it is handed out again after
//     the delay, and the committed offset waits for it; later messages of
//     the same key (OrderPerKey, the default) or of the partition
//     (OrderPerPartition) wait behind it, other keys and partitions go on.
//     With WithRetryTopic, a copy goes to a retry topic that the Source also
//     consumes, and the original is marked done.
//   - DeadLetter produces the message to "<topic>.dlq" (WithDeadLetterTopic)
//     with the cause under driver.CauseHeader ("idemq-cause", the same on
//     every broker) and the original topic, partition and offset in
//     headers (HeaderOriginalTopic, ...), waits for the write (acks=all),
//     then marks it done. A failed write is tried a few times with backoff
//     within the call; then DeadLetter returns the error and the message
//     stays undecided: it is handed out again a second later (its key, or
//     its partition under OrderPerPartition, waits behind it; other keys
//     and partitions go on), its offset is not committed, and a restart
//     or the next owner gets it again. It is never dropped.
//
// Dead-letter and retry topics: Open checks that they exist. A missing one
// is created with the consumed topic's partition count and replication
// factor (Kafka's CreateTopics; the principal needs the Create permission
// on the cluster or the topic). When the cluster refuses, Open fails with
// an error naming the setting (dead_letter_topic / retry_topic in a URL,
// WithDeadLetterTopic / WithRetryTopic in code), rather than every dead
// letter failing later.
//
// Rebalances: when the group rebalances, the Source stops handing out
// messages of the revoked generation, gives deliveries in flight
// WithRevokeTimeout (default 10s) to settle, commits what is decided and
// releases the partitions. It keeps heartbeating meanwhile (kafka-go stops
// when the generation ends), so a wait longer than the session timeout does
// not get the member evicted. A settlement that arrives later (or after
// Close) sends nothing and returns an error wrapping core.ErrStaleDelivery
// (driver.Stale); the new owner gets the message again from the committed
// offset and the dedup store decides Duplicate if its effect was
// committed — the design working, not a fault.
//
// Messages: the id comes from the "message-id" header (WithIDHeader; the
// CloudEvents Kafka binding's "ce_id" is a common alternative;
// core.WithIDFunc derives it otherwise). Key is the Kafka key; Headers are
// the Kafka headers as strings (trace context travels there); Source is
// the topic; System is "kafka"; Metadata carries the OpenTelemetry
// semantic-convention keys "messaging.destination.partition.id",
// "messaging.kafka.offset", "messaging.kafka.message.key",
// "messaging.destination.name" and "messaging.consumer.group.name" for
// tracing. Kafka keeps no delivery
// count, so Attempt comes from a counter kept in this process, raised for
// messages another process handed out before its last commit (from the
// commit metadata).
//
// Security: WithTLS and WithSASL (kafka-go's sasl/plain and sasl/scram
// mechanisms), or in a URL tls=true, ca_file, cert_file, key_file and
// sasl=plain|scram-sha-256|scram-sha-512 with the URL's user name and
// password, apply to every connection of the Source (group, fetches,
// commits, dead-letter and retry writers) and of the Publisher. Errors and
// logs never quote the password.
//
// Logging: a Source logs rebalances, commit failures and failed dead-letter
// writes to the logger of WithLogger (or core.WithAdapterLogger when
// opened by URL); without one, to the Consumer's logger (SetLogger), and
// to slog.Default() until then.
//
// Dead-letter queue: DeadLetters (OpenDeadLetters, or admin.OpenDeadLetters
// with the Source's own URL) lets an operator list a group's dead letters
// (Scan), produce chosen ones back to the partition they were consumed
// from without idemq's bookkeeping headers (Redrive; every group of that
// topic receives them, and those that applied one decide it Duplicate),
// or drop them (Purge). It reads the dead-letter topic with plain fetches
// up to the high watermark of the call's start, never as a member of a
// group, and skips other groups' records (HeaderGroup). Kafka cannot
// delete single records, so handled ones are recorded in a bookkeeping
// group ("<group>.dlq-operator", WithDeadLetterGroup): its committed
// offset passes every handled record below the first one still parked,
// and the handled records above it are ranges in the commit's metadata,
// which bounds how many can be handled out of order (see DeadLetters).
//
// Importing the package registers the kafka:// scheme with
// core.OpenSource, core.OpenPublisher and admin.OpenDeadLetters (see Open
// for the URL's parameters).
//
// A Publisher produces core Messages on a kafka-go Writer with
// RequiredAcks RequireAll, setting the id header and injecting the trace
// context of the context into the headers. Partition leaders are looked up
// again every second (kafka-go's default is every 6s, and a "not leader"
// answer does not refresh them): after a leader moves, writes find the new
// one within about a second.
//
// For development and tests without Docker, bench/cmd/kfake (its own module) serves an in-memory
// Kafka (github.com/twmb/franz-go/pkg/kfake) on a loopback port.
package kafka
