// Package sqlstore holds what idemq's SQL dedup stores (postgres, mysql,
// sqlite) share: the options every store has and their validation (Config),
// the pruner loop on the store's clock, the savepoint statements, the
// database/sql side of a transaction (Tx, for mysql and sqlite), the
// per-consumer statistics of Inspect, and the reading of a store's URL
// parameters. Driver-specific work (claims, pgx batches, server error
// codes) stays in each store.
package sqlstore
