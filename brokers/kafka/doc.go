// Package kafka is idemq's Kafka broker adapter, built on
// github.com/segmentio/kafka-go.
//
// A Source consumes one topic as a member of a consumer group, on kafka-go's
// ConsumerGroup/Generation API rather than a group Reader, which hides
// partition assignment: the Source must know when partitions are revoked to
// settle and commit before releasing them. On Kafka the "ack" is an offset
// commit covering every earlier offset of the partition, so the committed
// offset only advances over the contiguous prefix of decided messages, and
// the commit's metadata says which offsets above it are decided (see
// WithCommit, WithRetryTopic, WithDeadLetterTopic and WithRevokeTimeout).
//
// A message's id is the "message-id" header (WithIDHeader), its Key the
// Kafka key, its Source the topic; Metadata carries OpenTelemetry's
// messaging keys. Kafka keeps no delivery count, so Attempt comes from a
// counter in this process, raised for messages another process handed out
// before its last commit.
//
// Importing the package registers kafka:// with core.OpenSource,
// core.OpenPublisher and admin.OpenDeadLetters:
//
//	kafka://[user:password@]host:port[,host:port...]/topic?group=id&...
//
// Its parameters set the options of the same meaning: group, id_header,
// ordering (per-key, per-partition, none), dead_letter_topic,
// dead_letter_group, retry_topic, start (first, last), commit_interval and
// commit_count (WithCommit), revoke_timeout, session_timeout,
// heartbeat_interval and rebalance_timeout (WithGroupTimeouts); tls=true
// with ca_file (default: the system roots), cert_file and key_file;
// sasl=plain|scram-sha-256|scram-sha-512 with the URL's user name and
// password (percent-encoded), which need it. Errors and logs never quote
// the password.
//
// For development and tests without Docker, bench/cmd/kfake (its own
// module) serves an in-memory Kafka on a loopback port.
package kafka
