// Package benchmark measures idemq against hand-written consumers on the
// same data and the same business effect, in one run: the seed pattern on
// the raw drivers (one transaction per message, at prefetch 5 with one
// worker and at prefetch 100 with 8 workers), a hand-tuned batch consumer
// (one multi-row claim, one set-based UPDATE, one commit, one multiple ack
// per batch), the broker alone (consume and ack, no database), and idemq
// at batch size 1 and in batch mode (a per-message handler with
// postgres.Queue, and a set-based BatchHandler).
//
// Every run publishes Config.N messages plus Config.Duplicates × N copies
// of recent ones to a fresh queue, each a JSON payment
// {"account": "acc-17", "amount_cents": 1250} with its business id as the
// AMQP message_id (the message-id header on Kafka, the message-id
// attribute on SQS and Pub/Sub, the Nats-Msg-Id header on NATS, where a duplicate copy
// carries its own Nats-Msg-Id, which JetStream would otherwise drop, and
// the business id in idemq-id, the idemq-id field of a Redis entry, a
// duplicate copy being an entry of its own); the effect is
//
//	UPDATE accounts SET balance_cents = balance_cents + $amount WHERE account = $account
//
// on pre-created accounts, in the same transaction as the claim. The
// backlog is consumed and timed (msgs/s); then a paced phase publishes
// Config.LatencyMessages more at Config.LatencyRate, each stamped with its
// publish time, and the time from publish to decision gives p50/p99 (at
// the commit for the baselines, when the decision is settled for idemq,
// which then runs without observers unless the configuration names them).
// After every run the balances are compared with the expected sums and
// the dedup table must hold exactly one row per unique id: a run that
// breaks either is reported FAILED, never as a number.
//
// The broker and the store are independent choices (Config.Broker,
// Config.Store): RabbitMQ (amqp://), Kafka (kafka://; bench/cmd/kfake serves
// one in memory), SQS (sqs://; the fauxqs emulator or AWS), Google Cloud
// Pub/Sub (pubsub://; Google's emulator or Pub/Sub), NATS JetStream
// (nats://) or Redis Streams (redis://, rediss://) into Postgres
// (postgres://) or MariaDB/MySQL (mysql://). Each broker writes its own
// raw-driver consumers (amqp091-go, kafka-go, aws-sdk-go-v2, the Pub/Sub
// client's low-level SubscriberClient, nats.go, go-redis: acks, offset
// commits, DeleteMessage/DeleteMessageBatch, Acknowledge per message or
// per batch, AckSync and acks + flush on a durable pull consumer, XREADGROUP in a
// consumer group with an XACK per message or one per batch) and each
// store its own transactions (pgx: ON CONFLICT DO NOTHING claims, UPDATE … FROM unnest;
// go-sql-driver/mysql: INSERT IGNORE claims, INSERT IGNORE … RETURNING on
// MariaDB, UPDATE … JOIN), so every combination compares idemq with
// baselines written for it. SQS batches are at most 10 (ReceiveMessage,
// DeleteMessageBatch), Pub/Sub's at most 1,000 (a Pull); Kafka messages are keyed by account, and each run's
// topic has 8 partitions unless the URL's partitions parameter says
// otherwise.
//
// Run returns a Report that prints as a table (WriteTable), as JSON
// (WriteJSON) and as a bar chart (WritePNG). The idemq-bench command
// (bench/cmd/idemq-bench) is a thin front end to Run.
//
// Watermill runs the seed pattern on another framework, Watermill's
// message.Router with a watermill-amqp subscriber (RabbitMQ only), and
// runs only when named in Config.Configs; so do SeedFranz and
// HandBatchFranz, the Kafka baselines written on franz-go (the client of
// idemq's Kafka adapter) beside the kafka-go ones.
//
// The scenarios MemoryScenario, GrowthScenario and LeasedScenario are slow
// and run only when named in Config.Configs. MemoryScenario
// compares peak RSS with 10,000 and 1,000,000 messages queued.
// GrowthScenario fills a dedup table with Config.GrowthRows old rows,
// compares idemq batch throughput on it with an empty table, then holds
// the paced p99 while admin.Prune deletes those rows
// (Config.PruneBatch a statement, Config.PruneDuty of the time) against
// the p99 of a paced phase as long with nothing else running.
// LeasedScenario (Postgres only) gives each message a slow external
// effect, a charge through a fake payment provider that answers after
// Config.ProviderDelay (with the idempotency key of effects.Keyer), then
// a ledger row, and runs it twice on a pool of Config.Pool connections:
// inside the dedup transaction (core.New) and outside any transaction under
// a lease (core.NewLeased, window 500). Besides msgs/s it samples
// pg_stat_activity every 5ms for the transactions the consumer holds open;
// its check counts ledger rows and the provider's charges, one per unique
// id.
package benchmark
