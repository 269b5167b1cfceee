// Package sqlstore holds what idemq's SQL dedup stores (postgres, mysql,
// sqlite) share: the interfaces each implements (Store, Txn); the options
// every store has, their validation and error wording (Config, Build); New
// and Open's migrate-or-close tail; the pruner loop on the store's clock;
// the savepoint statements; every store's lease table and lease checks
// (LeaseTable, LeaseStart, FirstToken, Completed); the lost-connection
// errors IsTransient retries (ConnLost); the reading of a store's URL
// parameters (URLParams, Opener); and the database/sql store itself
// (Engine, its transaction End), which mysql and sqlite embed with their
// Dialect: the claim and its read-back, DDL, placeholders, error classes,
// Lookup and Forget, Inspect, Prune, leases. postgres keeps its own pgx
// path and uses the shared pieces that are the same.
package sqlstore
