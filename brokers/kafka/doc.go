// Package kafka is idemq's Kafka broker adapter, built on
// github.com/twmb/franz-go: consumer groups (Source), share groups
// (ShareSource, KIP-932), a Publisher, and the dead letters both park
// (DeadLetters).
//
// A Source consumes one topic as a member of a consumer group. On Kafka
// the "ack" is an offset commit covering every earlier offset of the
// partition, so the committed offset only advances over the contiguous
// prefix of decided messages, and the commit's metadata says which offsets
// above it are decided (see WithCommit, WithRetryTopic and
// WithDeadLetterTopic). Messages of one key go one at a time
// (WithOrdering); a retry is handed out again in place, after the
// Consumer waited out its delay, never letting the commit pass it. Kafka
// keeps no delivery count, so Attempt comes from a counter in this
// process, raised for messages another process handed out before its last
// commit.
//
// Membership suits how services are deployed: the cooperative-sticky
// balancer moves only the partitions that change owner, so a member that
// joins or leaves costs the others nothing; WithInstanceID makes a member
// static, so a restart within the session timeout (a crash loop, a rolling
// deploy) moves no partition at all; WithGroupProtocol(ProtocolConsumer)
// takes KIP-848's broker-side assignment where the broker has it. A
// partition the group takes away stops handing out its messages, settles
// what is decided (WithRevokeTimeout), commits, and leaves the rest to its
// next owner, while the other partitions go on; a settlement after that is
// stale (driver.ErrStaleDelivery) and commits nothing.
//
// A ShareSource consumes one topic as a member of a share group: many
// members read one partition, the broker locks each record it hands out
// and takes an acknowledgement per record (see ShareSource). Attempt is
// the broker's delivery count, and the group's delivery-count limit is
// reported (driver.DeliveryLimiter). A share group keeps no order, per key
// or per partition.
//
// A message's id is the "message-id" header (WithIDHeader), or with
// WithOffsetID topic/partition/offset for a record without it; its Key is
// the Kafka key, its Source the topic; Metadata carries OpenTelemetry's
// messaging keys.
//
// Importing the package registers kafka:// and kafka+share:// with
// core.OpenSource and admin.OpenDeadLetters, and kafka:// with
// core.OpenPublisher:
//
//	kafka://[user:password@]host:port[,host:port...]/topic?group=id&...
//	kafka+share://[user:password@]host:port[,host:port...]/topic?group=id&...
//
// Their parameters set the options of the same meaning. Both: group,
// id_header, offset_id, dead_letter_topic, dead_letter_group, start
// (first, last; as-is for a share group); tls=true with ca_file (default:
// the system roots), cert_file and key_file; sasl=plain|scram-sha-256|
// scram-sha-512 with the URL's user name and password (percent-encoded),
// which need it. kafka:// only: ordering (per-key, per-partition, none),
// retry_topic, commit_interval and commit_count (WithCommit),
// revoke_timeout, session_timeout, heartbeat_interval and rebalance_timeout
// (WithGroupTimeouts), instance_id and group_protocol (classic, consumer).
// kafka+share:// only: max_extension. Errors and logs never quote the
// password.
//
// For development and tests without Docker, bench/cmd/kfake (its own
// module) serves an in-memory Kafka on a loopback port.
package kafka
