// Package idempotency is the server side of the Idempotency-Key header
// (IETF draft-ietf-httpapi-idempotency-key-header) as net/http middleware
// (Handler for a HandlerFunc, Wrap for the func(http.Handler) http.Handler
// routers take, the transaction then from TxFromContext), for handlers
// whose effect is a database transaction of an idemq store:
// the key is claimed in the handler's transaction, the response is stored
// in that same transaction, and a retry of the request gets the stored
// response instead of applying the effect again. A crash between the
// commit and the response therefore loses nothing: the retry is answered
// from the database.
//
// The key is an RFC 8941 string (Idempotency-Key: "8e03…"), or, for
// clients that send it bare as Stripe's do, a token of letters, digits and
// !#$%&'*+-.^_`|~:/=, at most MaxKeyLength bytes. It is unique within a
// scope the service must give (WithScope: the authenticated principal and
// the route), so that two clients sending the same key and body each get
// their own effect and response. A request's fingerprint covers its
// method, path, query and body.
//
// Answers the middleware writes itself are RFC 9457 problems
// (application/problem+json):
//
//   - 400: the key is missing (unless WithKeyOptional) or malformed;
//   - 409 with Retry-After: a request with the key is in progress
//     (Retry-After 1 while it runs; on the stores that lease keys, the
//     lease's remaining seconds when its holder stopped renewing it);
//   - 410: the key's request completed, but its stored response was
//     pruned while its claim was not;
//   - 413: the body is over WithMaxBody;
//   - 422: the key was used with another method, path, query or body;
//   - 500: the handler returned an error (nothing was applied or stored;
//     a handler under Wrap that answered 500 or more gets its own answer
//     sent instead);
//   - 503 with Retry-After: the database failed; a retry is safe.
//
// The store is asked for what the middleware needs (driver.SQLStore and
// driver.SQLTxn for the responses' table, driver.BusyClaimStore or
// driver.Leaser for keys in progress), never told by its driver's type.
// On PostgreSQL a request in progress holds its key by the claim its
// handler's transaction makes first and has not committed yet: a copy's
// claim meets it, gives up after 100 ms instead of waiting
// (driver.BusyClaimer) and is answered 409 with Retry-After 1, and the
// uncommitted claim ends with the transaction, so a failed request, or
// one whose process or connection died, holds the key no longer. On MySQL/MariaDB
// and SQLite it holds the key under a lease of the store
// (driver.Leaser), renewed while its handler runs, and copies are told
// Retry-After 1 while it is renewed; a process that crashed holds it no
// longer than WithLease, after which a retry takes it over.
// The completing transaction fences the lease (driver.Fencer), so a
// request whose lease was taken over cannot complete. Replays carry
// Idempotent-Replayed: true and the headers of WithStoredHeaders.
//
// Keys expire when their claims and responses are pruned: the store
// prunes claims after its retention, Middleware.Prune the responses; a
// key whose claim is gone is new again. Publish that expiry to clients.
package idempotency
