// Package kafka is idemq's Kafka broker adapter, built on
// github.com/segmentio/kafka-go.
//
// A Source consumes one topic as a member of a consumer group, on kafka-go's
// ConsumerGroup/Generation API rather than a group Reader, which hides
// partition assignment: the Source must know when partitions are revoked to
// settle and commit before releasing them. Each generation's partitions are
// fetched by per-partition readers from the committed offsets.
//
// On Kafka the "ack" is an offset commit, and it covers every earlier
// offset of the partition. The Source turns that into idemq's per-message
// settlement:
//
//   - Ack marks a message done. The committed offset only advances over the
//     contiguous prefix of decided messages, so a message in flight (or
//     waiting for a retry) is never skipped, whatever order messages complete
//     in. Commits are batched (WithCommit) and flushed when partitions are
//     revoked and on Close. The commit's metadata also records which offsets
//     above the committed one are decided, so the next owner skips them
//     (Stats.Skipped).
//   - Retry puts the message back in place: the committed offset waits for
//     it, and later messages of its key (OrderPerKey) or partition
//     (OrderPerPartition) wait behind it. With WithRetryTopic, a copy goes to
//     a retry topic the Source also consumes, and the original is done.
//   - DeadLetter produces a copy to "<topic>.dlq" (WithDeadLetterTopic) with
//     the bookkeeping headers of core/driver (idemq-cause, idemq-attempt,
//     idemq-origin as topic/partition/offset, idemq-destination,
//     idemq-parked-at) and HeaderGroup, waits for acks=all, then marks the
//     original done; a copy that cannot be written leaves it undecided, never
//     dropped.
//
// Open checks that the dead-letter and retry topics exist and creates a
// missing one like the consumed topic (the principal needs the Create
// permission); when the cluster refuses, Open fails naming the setting.
//
// Rebalances: the Source stops handing out the revoked generation's
// messages, gives deliveries in flight WithRevokeTimeout to settle, commits
// what is decided and releases the partitions, heartbeating meanwhile
// (kafka-go stops when the generation ends) so a long wait does not get the
// member evicted. A settlement after that (or after Close) sends nothing
// and returns an error wrapping core.ErrStaleDelivery: the new owner gets
// the message again and the dedup store decides Duplicate if its effect was
// committed.
//
// Messages: the id is the "message-id" header (WithIDHeader). Key is the
// Kafka key, Headers the Kafka headers as strings, Source the topic, System
// "kafka"; Metadata carries OpenTelemetry's messaging.destination.name,
// messaging.destination.partition.id, messaging.kafka.offset,
// messaging.kafka.message.key and messaging.consumer.group.name. Kafka
// keeps no delivery count, so Attempt comes from a counter in this process,
// raised for messages another process handed out before its last commit.
//
// URLs: importing the package registers kafka:// with core.OpenSource,
// core.OpenPublisher and admin.OpenDeadLetters. Each parameter maps to the
// option of the same meaning:
//
//	kafka://[user:password@]host:port[,host:port...]/topic?group=id&...
//
//	group               the consumer group id           (WithGroup)
//	id_header           the business id header          (WithIDHeader)
//	ordering            per-key | per-partition | none  (WithOrdering)
//	dead_letter_topic   the DLQ topic                   (WithDeadLetterTopic)
//	dead_letter_group   DeadLetters' bookkeeping group  (WithDeadLetterGroup)
//	retry_topic         retry via this topic            (WithRetryTopic)
//	start               first | last                    (WithStartOffset)
//	commit_interval, commit_count                       (WithCommit)
//	revoke_timeout      a duration                      (WithRevokeTimeout)
//	session_timeout, heartbeat_interval, rebalance_timeout
//	                    durations                       (WithGroupTimeouts)
//	tls                 true: connect with TLS          (WithTLS)
//	ca_file             PEM CA to verify the brokers (default: system roots)
//	cert_file, key_file PEM client certificate and key, for mutual TLS
//	sasl                plain | scram-sha-256 | scram-sha-512, with the
//	                    URL's user name and password    (WithSASL)
//
// ca_file, cert_file and key_file need tls=true; a user name or password
// needs sasl=, and sasl= needs both (percent-encoded). Errors and logs never
// quote the password; an unknown parameter is an error naming it.
//
// A Publisher produces on a kafka-go Writer with acks=all, setting the id
// header and injecting the trace context into the headers; it looks
// partition leaders up every second, so after a leader moves writes find
// the new one within about a second. DeadLetters (OpenDeadLetters) lets an
// operator list, redrive and purge a group's dead letters.
//
// For development and tests without Docker, bench/cmd/kfake (its own
// module) serves an in-memory Kafka on a loopback port.
package kafka
