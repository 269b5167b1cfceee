// Package kafkashare is idemq's source for Kafka share groups (KIP-932,
// "queues for Kafka"), built on github.com/twmb/franz-go. It is a module of
// its own, so that a service which does not import it does not build
// franz-go; the classic consumer-group adapter is brokers/kafka.
//
// In a share group many members read one partition: the broker locks each
// record it hands out (group.share.record.lock.duration.ms, 30s by
// default) and takes an acknowledgement per record. The Source maps
// idemq's settlements onto them:
//
//   - Ack is ACCEPT, sent after the commit; a batch's acknowledgements are
//     flushed once (driver.BatchSettler).
//   - Retry is RELEASE, after the Consumer's backoff delay: the record stays
//     locked to this member until then (at most what is left of its lock,
//     less a tenth), so a retry is not redelivered at once.
//   - DeadLetter produces a copy of the record to the dead-letter topic,
//     with the cause and the other idemq bookkeeping headers (as the
//     kafka:// adapter writes them, so its dead-letter tools read it), then
//     REJECTs the record. When the copy fails, the record is released,
//     never rejected.
//   - A record whose handler outlives the lock is renewed (RENEW, Kafka
//     4.2) by a heartbeat, up to WithMaxExtension after its delivery.
//   - A settlement after the lock lapsed, or after Close, is stale
//     (driver.ErrStaleDelivery): the broker delivers the record again, and
//     the Consumer decides that copy Duplicate if the first was committed.
//
// Attempt is the broker's delivery count. The broker archives a record
// delivered group.share.delivery.count.limit times (5 by default) without
// an ACCEPT, without a copy anywhere: the Source reports the limit
// (driver.DeliveryLimiter) and the Consumer warns, or refuses to start,
// when its WithMaxAttempts would dead-letter later than that.
//
// A message's id is the "message-id" header (WithIDHeader), as the
// kafka:// Publisher writes it; a record without one takes
// topic/partition/offset, the same on every redelivery of the record.
// Unlike a consumer group, a share group keeps no order, per key or per
// partition: records of one key may be decided at the same time by
// different members.
//
// franz-go accepts, at each poll, every record of the previous poll left
// without an acknowledgement; the Source therefore polls again only once
// every record of the last poll is settled (or its lock lapsed, which it
// then releases), and a Retry waiting out its delay holds the next poll
// back. Size the Consumer's window (records per poll) for that; with
// core.WithLinger(time.Millisecond) a poll's records, which arrive
// together, go in one batch.
//
// Importing the package registers kafka+share:// with core.OpenSource and
// admin.OpenDeadLetters (OpenDeadLetters):
//
//	kafka+share://host:port[,host:port...]/topic?group=G&...
//
// Its parameters set the options of the same meaning: group, id_header,
// dead_letter_topic, start (first, last, as-is), max_extension and window.
// TLS and SASL are franz-go options, given with WithClientOptions.
// Publish to the topic with the kafka:// Publisher.
package kafkashare
