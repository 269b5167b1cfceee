// Package admin is what operators and tools use on a running idemq
// deployment, apart from what a service runs (package core): open a dedup
// store by URL whatever its transaction type, migrate and prune it, look
// claims up and forget them, read a table's and its consumers' statistics
// (a full count) or estimate the table's size cheaply, compare the store's
// retention with a broker's redelivery horizon, and list, redrive and
// purge dead letters and parked outbox rows. The idemq command is built on
// it, and a service can call the same functions.
//
// A store or broker adapter offers these operations by implementing the
// interfaces here (Migrator, Pruner, Inspector, Estimator, Lookuper,
// Forgetter, DeadLetterQueue) and registering dead-letter queues and
// outbox tables by URL scheme (RegisterDeadLetters, RegisterOutbox).
package admin
