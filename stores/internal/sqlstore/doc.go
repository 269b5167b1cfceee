// Package sqlstore holds what idemq's SQL dedup stores (postgres, mysql,
// sqlite) share: the interfaces each implements (Store, Txn); the options
// every store has, their validation and error wording (Config); New and
// Open's migrate-or-close tail (Migrated); the pruner loop on the store's
// clock; the savepoint statements; the database/sql side of a transaction
// that mysql and sqlite share (Tx: savepoints, commit, rollback, id lists,
// Unclaim); Inspect's per-consumer statistics; Lookup and Forget of
// chosen claims (Claims, InOrder); the leased claims of the database/sql
// stores (Acquire, Renew, Release, Fence) and every store's lease table
// name (LeaseTable); the lost-connection errors IsTransient retries
// (ConnLost); and the reading of a store's URL parameters (URLParams,
// Opener). Driver-specific work (claims, pgx
// batches, server error codes) stays in each store.
package sqlstore
