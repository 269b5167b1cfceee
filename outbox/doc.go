// Package outbox is the producer side of idemq: a transactional outbox and
// the relay that publishes it.
//
// A service writes its business rows and the messages that announce them in
// ONE database transaction (pgoutbox.Write for Postgres, mysqloutbox.Write
// for MySQL and MariaDB). Either both commit or neither does, so no message
// is lost when the broker is down and none is invented when the transaction
// rolls back. Every message gets a stable id (a UUIDv7 unless the caller
// chose one); it travels as the message's business id on every broker, so
// the idemq consumer deduplicates on it.
//
// A Relay reads pending rows and publishes them through a Publisher that
// returns only after the broker confirmed (RabbitMQ publisher confirms,
// Kafka acks=all, SQS batch send), then marks the rows sent, or deletes
// them, in the transaction that locked them. A relay that dies between the
// confirm and that commit publishes the rows again after the restart; the
// consumer's dedup absorbs the copy. Publishing is therefore at least once
// and effects are exactly once.
//
// # Ordering and several relays
//
// Rows with the same ordering key (Message.Key) are published in commit
// order, also with several relays running at once:
//
//   - Write serializes the writers of one key until commit (a transaction
//     advisory lock on Postgres, a row lock on MySQL), so per key the
//     row sequence order is the commit order: a row can never become
//     visible behind a later one of its key.
//   - A relay claims only the head of a key (its oldest pending row) with
//     FOR UPDATE SKIP LOCKED, and then, under the head's lock, the rows that
//     follow it. A second relay skips the locked head and therefore the
//     whole key; it cannot see the next head before the first relay has
//     committed, which it does only after the broker confirmed.
//
// Rows without a key have no order and are spread over the relays freely.
// Rows of one key are published by one relay at a time, so a single hot key
// is as fast as one relay.
//
// The order reaches the broker; keeping it on the consumer side is the
// consumer's business. AMQP carries no ordering key, so a RabbitMQ queue
// keeps publish order for one consumer only, and core.Consumer decides the
// deliveries of its window concurrently: a consumer that must apply a key's
// messages in order runs with core.WithWindow(1) (or on Kafka partitions or
// SQS FIFO message groups, which the key maps to).
//
// # Failures
//
// A publish that fails (or times out, WithPublishTimeout) leaves its rows
// pending and postpones them with a growing delay (WithRetryBackoff), so a
// broken destination does not hold up the others; rows with the same key
// wait behind the postponed one. Each failure's error is recorded with the
// row. The pending-rows gauges show the backlog and its age.
//
// A row that still fails after WithMaxAttempts publishes (default 20,
// about an hour with the default backoff) is parked: the broker rejects
// it for good (too large, a destination that does not exist), and
// retrying it forever would only hide it. A row whose publish alone fails
// with an error the publisher marked permanent (core.Permanent: the
// broker's answer leaves no doubt) is parked at once (see
// WithMaxAttempts). A parked row is neither pending nor sent; no relay
// claims it, it keeps its place in its key and the
// error of its last publish as its cause, and the relay logs it (row,
// key, destination, attempts, cause) and counts it (RelayStats.Parked,
// the idemq.outbox.parked counter). What happens to the rows behind it in
// its key is WithParkedKey's choice: HoldKey, the default, keeps them
// waiting, so the key's order holds; SkipParked publishes them, so the
// key keeps flowing.
//
// Parked rows wait for an operator: the stores implement Operator, which
// lists them (Parked), makes them pending again once the cause is fixed
// (Redrive: the row is published at once, ahead of the rows held behind
// it), deletes them unpublished (Purge), and counts the backlog with the
// keys held back (Stats). The idemq command does the same from a shell:
// idemq outbox list|redrive|purge|stats --store URL.
//
// Messages are core.Messages once published: ID, Key, Headers and Body as
// written; the trace context of the writing transaction's context is in
// the headers. The relay publishes through a driver.Publisher, the one shape
// every broker's publisher has: rabbitmq.Publisher (destination: routing
// key), kafka.Publisher (topic), sqs.Publisher (queue name or URL) and
// memory.Broker take the row's destination as it is; Destinations maps
// destinations to publishers opened by URL, one each.
package outbox
