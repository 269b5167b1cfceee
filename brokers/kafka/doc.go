// Package kafka is idemq's Kafka broker adapter, built on
// github.com/segmentio/kafka-go.
//
// A Source consumes one topic as a member of a consumer group, on kafka-go's
// ConsumerGroup/Generation API rather than a group Reader, which hides
// partition assignment: the Source must know when partitions are revoked to
// settle and commit before releasing them.
//
// On Kafka the "ack" is an offset commit, and it covers every earlier
// offset of the partition. The Source turns that into idemq's per-message
// settlement: the committed offset only advances over the contiguous prefix
// of decided messages, so a message in flight or waiting for a retry is
// never skipped; commits are batched (WithCommit) and their metadata says
// which offsets above them are decided, so the next owner skips those. A
// retry waits in place (or goes through WithRetryTopic); a dead letter is a
// copy in "<topic>.dlq" with the bookkeeping headers of core/driver
// (idemq-origin is topic/partition/offset) and HeaderGroup. When a
// rebalance revokes partitions, deliveries in flight get WithRevokeTimeout
// to settle, while the Source keeps heartbeating; a settlement after that
// (or after Close) is stale, and the next owner's dedup store decides the
// message Duplicate if its effect was committed.
//
// Messages: the id is the "message-id" header (WithIDHeader). Key is the
// Kafka key, Headers the Kafka headers as strings, Source the topic, System
// "kafka"; Metadata carries OpenTelemetry's messaging.destination.name,
// messaging.destination.partition.id, messaging.kafka.offset,
// messaging.kafka.message.key and messaging.consumer.group.name. Kafka
// keeps no delivery count, so Attempt comes from a counter in this process,
// raised for messages another process handed out before its last commit.
//
// Importing the package registers kafka:// with core.OpenSource,
// core.OpenPublisher and admin.OpenDeadLetters. Each URL parameter maps to
// the option of the same meaning:
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
// quote the password.
//
// For development and tests without Docker, bench/cmd/kfake (its own
// module) serves an in-memory Kafka on a loopback port.
package kafka
