package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/core/driver/retry"
)

// HandlerFunc handles a request inside the store's transaction tx
// (pgx.Tx for Postgres, *sql.Tx for MySQL/MariaDB and SQLite): it applies
// its effect in tx and writes its response to w. It returns nil to commit
// the effect together with the key's claim and the response, or an error
// to roll everything back; the client then gets a 500 problem and its
// retry runs the handler again. A 4xx or 5xx the handler writes itself and
// returns nil for is committed, stored and replayed like any response.
type HandlerFunc[Tx any] func(w http.ResponseWriter, r *http.Request, tx Tx) error

// Middleware runs handlers (a HandlerFunc with Handler, an http.Handler
// with Wrap) so that requests carrying the same Idempotency-Key apply
// their effect once and get the same response. It is safe for concurrent
// use.
type Middleware[Tx any] struct {
	store  driver.Store[Tx]
	leaser driver.Leaser // nil when locked
	tab    *table
	cfg    config
	// locked: a request in progress holds its key by its uncommitted
	// claim (driver.BusyClaimStore) instead of a lease.
	locked bool

	// afterCommit, when set, runs right after a request's transaction
	// committed and before its response is written.
	afterCommit func()
}

// New returns the middleware over store. WithScope is required: what a
// key is unique within is the service's to say. The key's claims live in
// the store's claims table under WithName and the responses in a table of
// their own (WithTable) in the same database, which Migrate creates; the
// store runs their statements in its dialect (driver.SQLStore: the
// PostgreSQL, MySQL/MariaDB and SQLite stores do). On a store whose
// transactions claim without waiting (driver.BusyClaimStore: PostgreSQL's)
// a request in progress holds its key by its claim, not yet committed; on
// the others by a lease, so store must then hold leases (driver.Leaser:
// the MySQL/MariaDB and SQLite stores do). Bad options fail here, each
// error naming its option.
func New[Tx any](store driver.Store[Tx], opts ...Option) (*Middleware[Tx], error) {
	if option.Present(store) != nil {
		return nil, errors.New("idempotency: New: nil store")
	}
	cfg := defaults()
	if err := option.ApplyAll(&cfg, opts...); err != nil {
		return nil, err
	}
	if cfg.scope == nil {
		return nil, option.Errorf(pkg, "WithScope", "required: what a key is unique within, the authenticated principal and the route, so that one client can neither replay nor block another's key")
	}
	m := &Middleware[Tx]{store: store, cfg: cfg}
	if bc, ok := store.(driver.BusyClaimStore); ok && bc.BusyClaims() {
		m.locked = true
	} else if m.leaser, ok = store.(driver.Leaser); !ok {
		return nil, fmt.Errorf("idempotency: New: the store %T cannot hold leases (driver.Leaser)", store)
	}
	db, ok := store.(driver.SQLStore)
	if !ok {
		return nil, fmt.Errorf("idempotency: New: the store %T cannot keep the responses in its database (driver.SQLStore)", store)
	}
	var err error
	if m.tab, err = newTable(cfg.table, db); err != nil {
		return nil, fmt.Errorf("idempotency: New: %w", err)
	}
	return m, nil
}

// Migrate creates the responses table and its stored_at index if they do
// not exist. The store's own Migrate creates the claims and lease tables.
func (m *Middleware[Tx]) Migrate(ctx context.Context) error { return m.tab.migrate(ctx) }

// Prune deletes at most limit responses stored before the given time and
// returns how many it deleted; call it in a loop until it returns fewer
// than limit, or hand the Middleware to admin.Prune. Prune responses no
// sooner than the store prunes its claims (its retention): a key whose
// claim outlives its response is answered 410.
func (m *Middleware[Tx]) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("idempotency: Prune: limit must be positive, got %d", limit)
	}
	n, err := m.tab.prune(ctx, before, limit)
	if err != nil {
		return 0, fmt.Errorf("idempotency: Prune %s: %w", m.tab.name, err)
	}
	return n, nil
}

// Handler returns h as an http.Handler. For each request it reads the
// Idempotency-Key and the body, then:
//
//   - a key whose request completed: the stored response, with
//     Idempotent-Replayed: true, when the method, URL and body are those
//     of the first request; 422 when they differ;
//   - a key in progress in another request: 409 with Retry-After;
//   - otherwise h runs in a store transaction that holds the key's claim;
//     when h returns nil the response is stored in that transaction,
//     which commits before the response is written.
//
// On PostgreSQL the transaction's first statement claims the key, giving
// up after 100 ms on a claim of another transaction not yet committed:
// that means in progress (409, Retry-After 1), and an uncommitted claim
// ends with its transaction, also when its process or connection dies. On the
// other stores the key is first leased to the request (driver.Leaser), in
// a transaction of its own, and the handler's transaction fences the
// lease before it commits.
//
// The response h writes is buffered until then; it cannot be streamed.
// The request's context carries tx too (TxFromContext).
func (m *Middleware[Tx]) Handler(h HandlerFunc[Tx]) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, func(w *recorder, r *http.Request, tx Tx) error { return h(w, r, tx) })
	})
}

// Wrap is the middleware form of Handler, func(http.Handler) http.Handler,
// which routers take: r.Use(keys.Wrap) with chi, e.Use(echo.WrapMiddleware(keys.Wrap))
// with echo. It decides each request as Handler does and runs next inside
// the store's transaction, which next reaches with TxFromContext: next
// applies its effect in it and writes its response, which commits, is
// stored and replayed. Having no error to return, next fails by answering
// a status of 500 or more (http.Error(w, "…", 500)): its transaction then
// rolls back, nothing is stored, the key is free for the retry, and its
// answer goes out as it is. A panic rolls back too.
//
// Requests of the safe methods (GET, HEAD, OPTIONS, TRACE) go to next
// directly, without a key or a transaction, so Wrap can guard a whole
// router.
func (m *Middleware[Tx]) Wrap(next http.Handler) http.Handler {
	if next == nil {
		panic("idempotency: Wrap: nil handler")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
			next.ServeHTTP(w, r)
			return
		}
		m.serve(w, r, func(w *recorder, r *http.Request, _ Tx) error {
			next.ServeHTTP(w, r)
			if w.status >= http.StatusInternalServerError {
				return &failedStatus{w.status}
			}
			return nil
		})
	})
}

// txKey is the request context's key of the store's transaction.
type txKey struct{}

// TxFromContext returns the store's transaction of the request whose
// context is ctx, for the handler Wrap (or Handler) runs: pgx.Tx on
// PostgreSQL, *sql.Tx on MySQL/MariaDB and SQLite. ok is false outside
// such a handler, or when Tx is not the store's transaction type.
func TxFromContext[Tx any](ctx context.Context) (tx Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(Tx)
	return tx, ok
}

// inner is what runs inside a request's transaction: a HandlerFunc, or
// the next handler of Wrap.
type inner[Tx any] func(w *recorder, r *http.Request, tx Tx) error

// call runs h with tx on the context of r.
func (h inner[Tx]) call(w *recorder, r *http.Request, tx Tx) error {
	return h(w, r.WithContext(context.WithValue(r.Context(), txKey{}, tx)), tx)
}

// failedStatus is how a handler of Wrap fails: it answered status, 500 or
// more.
type failedStatus struct{ status int }

func (e *failedStatus) Error() string { return fmt.Sprintf("the handler answered %d", e.status) }

func (m *Middleware[Tx]) serve(w http.ResponseWriter, r *http.Request, h inner[Tx]) {
	vals := r.Header.Values(HeaderKey)
	switch {
	case len(vals) == 0 && m.cfg.optional:
		m.plain(w, r, h)
		return
	case len(vals) == 0:
		writeProblem(w, http.StatusBadRequest, problemMissing, "Idempotency-Key is missing",
			"this request needs an Idempotency-Key header, a unique string per operation, sent again unchanged with every retry", 0)
		return
	case len(vals) > 1:
		writeProblem(w, http.StatusBadRequest, problemMalformed, "Idempotency-Key is malformed", "the header appears more than once", 0)
		return
	}
	key, err := parseKey(vals[0])
	if err != nil {
		writeProblem(w, http.StatusBadRequest, problemMalformed, "Idempotency-Key is malformed", err.Error(), 0)
		return
	}
	body, ok := m.readBody(w, r)
	if !ok {
		return
	}
	id := claimID(m.cfg.scope(r), key)
	claim := driver.Claim{ID: id, Fingerprint: fingerprint(r, body)}
	if m.locked {
		m.runLocked(w, r, h, claim)
		return
	}
	ctx := r.Context()
	lease, err := m.acquire(ctx, claim)
	if err != nil {
		m.storeFailed(w, "acquiring the key's lease", err)
		return
	}
	switch lease.Result {
	case driver.LeaseWon:
		m.run(w, r, h, claim, driver.LeaseRef{ID: id, Token: lease.Token})
	case driver.LeaseDone:
		m.replay(w, r, id)
	case driver.LeaseMismatch:
		mismatch(w)
	case driver.LeaseBusy:
		inProgress(w, m.busyRetryAfter(lease.Until))
	default:
		m.storeFailed(w, "acquiring the key's lease", fmt.Errorf("unknown lease result %v", lease.Result))
	}
}

// acquireTries bounds the attempts at a key's lease: MySQL/InnoDB answers
// concurrent first requests of one key with deadlocks (1213) that a new
// attempt gets past.
const acquireTries = 8

// acquire asks for the key's lease, trying again after a failure: an
// Acquire that failed left no lease behind, or, if only its answer was
// lost, a lease of its own that the next attempt finds busy (409).
func (m *Middleware[Tx]) acquire(ctx context.Context, claim driver.Claim) (driver.Lease, error) {
	b := retry.New(5*time.Millisecond, 200*time.Millisecond)
	for try := 1; ; try++ {
		lease, err := m.leaser.Acquire(ctx, m.cfg.name, claim, m.cfg.lease)
		if err == nil || try == acquireTries || !b.Wait(ctx) {
			return lease, err
		}
	}
}

// readBody reads the request body whole, up to WithMaxBody, and hands the
// handler a copy; false means the request was answered.
func (m *Middleware[Tx]) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.cfg.maxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeProblem(w, http.StatusRequestEntityTooLarge, problemTooLarge, "Request body too large",
			fmt.Sprintf("the body is over %d bytes", m.cfg.maxBody), 0)
		return nil, false
	case err != nil:
		writeProblem(w, http.StatusBadRequest, problemMalformed, "Request body unreadable", err.Error(), 0)
		return nil, false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, true
}

// fingerprint identifies a request: method, request URI (path and query,
// escaped: no newline) and body.
func fingerprint(r *http.Request, body []byte) string {
	b := make([]byte, 0, len(r.Method)+len(r.URL.RequestURI())+2+len(body))
	b = append(b, r.Method...)
	b = append(b, ' ')
	b = append(b, r.URL.RequestURI()...)
	b = append(b, '\n')
	b = append(b, body...)
	return core.Fingerprint(b)
}

// claimID is the id a key is claimed under: the scope's fingerprint (22
// characters, so ids stay short however long the scope), a space, and the
// key.
func claimID(scope, key string) string {
	return core.Fingerprint([]byte(scope)) + " " + key
}

// retryAfter is the whole seconds until a lease expires, at least 1.
func retryAfter(until time.Time) int {
	return max(1, int(math.Ceil(time.Until(until).Seconds())))
}

// runningRetryAfter is the Retry-After, in seconds, of a key held by a
// request that is running: how long it will run is not known, and a copy
// that comes back a second later gets its response once it is done.
const runningRetryAfter = 1

// clockSkew is how far the clocks of the replicas that stamp lease
// expiries may be apart.
const clockSkew = time.Second

// busyRetryAfter is the Retry-After of a key leased until until by
// another request. A request of the middleware that is running renews its
// lease every third of WithLease, which keeps more than half of it left:
// runningRetryAfter then. A lease with less left missed its renewals (its
// holder crashed or hung), and one with more than WithLease was not taken
// under this middleware's WithLease: the key is not free before it runs
// out, so its remaining seconds.
func (m *Middleware[Tx]) busyRetryAfter(until time.Time) int {
	if left := time.Until(until); left > m.cfg.lease/2 && left <= m.cfg.lease+clockSkew {
		return runningRetryAfter
	}
	return retryAfter(until)
}

// run runs h in a transaction under the key's lease, and completes the
// key in it when h returns nil.
func (m *Middleware[Tx]) run(w http.ResponseWriter, r *http.Request, h inner[Tx], claim driver.Claim, ref driver.LeaseRef) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stopRenew := m.keep(ctx, ref, cancel)
	txn, err := m.store.Begin(ctx)
	if err != nil {
		stopRenew()
		m.release(ctx, ref)
		m.storeFailed(w, "beginning the transaction", err)
		return
	}
	// The claim goes first, with the BEGIN where the store can: it is
	// not visible to copies before the commit, which meanwhile find the
	// lease live. The fence waits for the handler's end, since a fenced
	// lease row stays locked until the commit and would make copies wait
	// instead of being answered 409.
	won, err := txn.Claim(ctx, m.cfg.name, []driver.Claim{claim})
	if err == nil && (len(won) != 1 || won[0] != driver.ClaimWon) {
		err = fmt.Errorf("the claim of a leased key was %v", won)
	}
	if err != nil {
		stopRenew()
		m.abort(ctx, txn, ref)
		m.storeFailed(w, "claiming the key", err)
		return
	}
	rec := newRecorder()
	finished := false
	defer func() {
		if !finished { // h panicked: the panic goes on once the key is free
			stopRenew()
			m.abort(ctx, txn, ref)
		}
	}()
	herr := h.call(rec, r.WithContext(ctx), txn.Tx())
	finished = true
	stopRenew()
	if herr != nil {
		m.abort(ctx, txn, ref)
		m.handlerFailed(ctx, w, rec, herr, retryDetail)
		return
	}
	if !m.fence(ctx, w, txn, ref) {
		return
	}
	// A failed commit may have committed; if not, the lease is freed for
	// the retry.
	m.commitAndSend(ctx, w, txn, claim.ID, rec, "committing", func() { m.abort(ctx, txn, ref) })
}

// fence fences the lease in txn, so that txn commits only while the
// lease is still the request's; false means the request was answered
// otherwise.
func (m *Middleware[Tx]) fence(ctx context.Context, w http.ResponseWriter, txn driver.Txn[Tx], ref driver.LeaseRef) bool {
	f, ok := txn.(driver.Fencer)
	if !ok {
		m.abort(ctx, txn, ref)
		m.storeFailed(w, "fencing the lease", fmt.Errorf("the store's transactions (%T) cannot fence leases (driver.Fencer)", txn))
		return false
	}
	held, err := f.Fence(ctx, m.cfg.name, []driver.LeaseRef{ref})
	if err == nil && len(held) != 1 {
		err = fmt.Errorf("store fenced %d of 1 lease", len(held))
	}
	if err != nil {
		m.abort(ctx, txn, ref)
		m.storeFailed(w, "fencing the lease", err)
		return false
	}
	if !held[0] {
		// The lease expired and another request took the key over: it
		// decides the key, this one applies nothing.
		_ = txn.Rollback(context.WithoutCancel(ctx))
		writeProblem(w, http.StatusConflict, problemInProgress, "A request with this Idempotency-Key is in progress",
			"this request's hold on the key expired and another request took it over; retry to get its response", 1)
		return false
	}
	return true
}

// handlerFailed answers for a handler that failed with err, its
// transaction rolled back, so nothing was applied or stored: a handler of
// Wrap that answered 500 or more with its own answer, rec; any other with
// a 500 problem.
func (m *Middleware[Tx]) handlerFailed(ctx context.Context, w http.ResponseWriter, rec *recorder, err error, detail string) {
	m.cfg.logger.ErrorContext(ctx, "idempotency: handler failed; nothing was stored", "consumer", m.cfg.name, "err", err)
	if _, ok := errors.AsType[*failedStatus](err); ok {
		send(w, rec.header, rec.status, rec.body.Bytes())
		return
	}
	writeProblem(w, http.StatusInternalServerError, problemFailed, "The request failed", detail, 0)
}

// retryDetail is the detail of a keyed request's 500.
const retryDetail = "nothing was applied; retry with the same Idempotency-Key"

// commitAndSend completes the key id in txn, whose claim of it is made
// and which holds the handler's effect: it stores the response rec holds,
// commits, runs the afterCommit hook and sends the response. When the
// store fails it calls undo, which rolls txn back and frees the key, and
// answers 503, naming commitStep when the commit is what failed.
func (m *Middleware[Tx]) commitAndSend(ctx context.Context, w http.ResponseWriter, txn driver.Txn[Tx], id string, rec *recorder, commitStep string, undo func()) {
	res := rec.result(m.cfg.headers)
	st, ok := txn.(driver.SQLTxn)
	if !ok {
		undo()
		m.storeFailed(w, "completing the key", fmt.Errorf("the store's transactions (%T) cannot store the response (driver.SQLTxn)", txn))
		return
	}
	if err := m.tab.put(ctx, st, m.cfg.name, id, res, time.Now()); err != nil {
		undo()
		m.storeFailed(w, "completing the key", err)
		return
	}
	var err error
	if fc, ok := txn.(driver.FlushCommitter); ok {
		err = fc.FlushCommit(ctx)
	} else {
		err = txn.Commit(ctx)
	}
	if err != nil {
		undo()
		m.storeFailed(w, commitStep, err)
		return
	}
	if m.afterCommit != nil {
		m.afterCommit()
	}
	send(w, rec.header, res.status, res.body)
}

// mismatch answers 422 for a key used by another request.
func mismatch(w http.ResponseWriter) {
	writeProblem(w, http.StatusUnprocessableEntity, problemMismatch, "Idempotency-Key reused for another request",
		"a request with this key and a different method, URL or body was already processed", 0)
}

// inProgress answers 409 for a key another request holds.
func inProgress(w http.ResponseWriter, after int) {
	writeProblem(w, http.StatusConflict, problemInProgress, "A request with this Idempotency-Key is in progress",
		"retry after the time Retry-After gives", after)
}

// replay answers with the stored response of a completed key.
func (m *Middleware[Tx]) replay(w http.ResponseWriter, r *http.Request, id string) {
	s, found, err := m.tab.get(r.Context(), nil, m.cfg.name, id)
	m.answerStored(w, s, found, err)
}

// answerStored answers with a stored response read with found and err.
func (m *Middleware[Tx]) answerStored(w http.ResponseWriter, s stored, found bool, err error) {
	if err != nil {
		m.storeFailed(w, "reading the stored response", err)
		return
	}
	if !found {
		writeProblem(w, http.StatusGone, problemExpired, "The stored response has expired",
			"a request with this key was processed, but its response is no longer kept; use a new key only for a new operation", 0)
		return
	}
	s.header.Set("Idempotent-Replayed", "true")
	send(w, s.header, s.status, s.body)
}

// plain runs h in a transaction of its own, for a request without a key
// under WithKeyOptional.
func (m *Middleware[Tx]) plain(w http.ResponseWriter, r *http.Request, h inner[Tx]) {
	ctx := r.Context()
	txn, err := m.store.Begin(ctx)
	if err != nil {
		m.storeFailed(w, "beginning the transaction", err)
		return
	}
	defer txn.Rollback(context.WithoutCancel(ctx)) // after Commit it does nothing
	rec := newRecorder()
	if err := h.call(rec, r, txn.Tx()); err != nil {
		m.rollback(ctx, txn)
		m.handlerFailed(ctx, w, rec, err, "nothing was applied")
		return
	}
	if err := txn.Commit(ctx); err != nil {
		m.storeFailed(w, "committing", err)
		return
	}
	res := rec.result(nil)
	send(w, rec.header, res.status, res.body)
}

// keep renews the lease every third of WithLease until the returned stop
// is called; a lease found taken over cancels the handler's context (its
// fence would fail anyway).
//
// On SQLite it does nothing: the handler's transaction holds the write
// lock from its BEGIN, which every Acquire (and Renew) needs, so no other
// request can take the lease over until it ends.
func (m *Middleware[Tx]) keep(ctx context.Context, ref driver.LeaseRef, lost context.CancelFunc) (stop func()) {
	if m.tab.d == driver.DialectSQLite {
		return func() {}
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		retry.Every(rctx, m.cfg.lease/3, func(time.Time) {
			still, err := m.leaser.Renew(rctx, m.cfg.name, []driver.LeaseRef{ref}, m.cfg.lease)
			switch {
			case err != nil && rctx.Err() == nil:
				m.cfg.logger.WarnContext(rctx, "idempotency: renewing a key's lease failed", "consumer", m.cfg.name, "err", err)
			case err == nil && len(still) == 1 && !still[0]:
				m.cfg.logger.WarnContext(rctx, "idempotency: a key's lease was taken over while its handler ran", "consumer", m.cfg.name)
				lost()
			}
		})
	}()
	return func() { cancel(); <-done }
}

// abort rolls txn back and releases the lease, so a retry runs at once.
func (m *Middleware[Tx]) abort(ctx context.Context, txn driver.Txn[Tx], ref driver.LeaseRef) {
	m.rollback(ctx, txn)
	m.release(ctx, ref)
}

// rollback rolls txn back, even when ctx is done; after a commit it does
// nothing.
func (m *Middleware[Tx]) rollback(ctx context.Context, txn driver.Txn[Tx]) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := txn.Rollback(ctx); err != nil {
		m.cfg.logger.WarnContext(ctx, "idempotency: rollback failed", "consumer", m.cfg.name, "err", err)
	}
}

// release gives the key's lease up; a failure only makes a retry wait for
// the lease to expire.
func (m *Middleware[Tx]) release(ctx context.Context, ref driver.LeaseRef) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := m.leaser.Release(ctx, m.cfg.name, ref); err != nil {
		m.cfg.logger.WarnContext(ctx, "idempotency: releasing a key's lease failed; its retries wait for it to expire", "consumer", m.cfg.name, "err", err)
	}
}

// storeFailed answers 503 for a store that failed during step: the retry
// is safe, and decides the key again.
func (m *Middleware[Tx]) storeFailed(w http.ResponseWriter, step string, err error) {
	m.cfg.logger.Error("idempotency: store failed", "consumer", m.cfg.name, "step", step, "err", err)
	writeProblem(w, http.StatusServiceUnavailable, problemStore, "The request could not be decided",
		"the database failed while "+step+"; retry with the same Idempotency-Key", 1)
}
