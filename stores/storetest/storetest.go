// Package storetest is the conformance suite every idemq dedup store runs
// from its own tests against a real database. It counts committed business
// effects, not just claims: a store passes only if each (consumer, id) has
// its effect committed at most once, and a claim disappears with a failed
// transaction or savepoint.
//
// A store's test supplies a Harness and calls Run:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness[*sql.Tx]{Open: ..., Effect: ..., CountEffects: ...})
//	}
package storetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
)

// Config is what a subtest asks the Harness to open.
type Config struct {
	// Table is the dedup table's name, unique per subtest (or a deliberately
	// invalid name in the validation subtest).
	Table string
	// Now is the store's clock: it stamps processed_at on claims, so the
	// prune subtest can age rows.
	Now func() time.Time
}

// Harness adapts one store to the suite.
type Harness[Tx any] struct {
	// Open returns a migrated store on cfg.Table using cfg.Now as its
	// clock; an invalid table name must return an error. It should drop
	// the table and its lease table (cfg.Table + "_leases") with
	// t.Cleanup. The Prune and MigrateTwice cases run when
	// the store implements admin.Pruner and admin.Migrator, which are
	// optional, and are skipped otherwise.
	Open func(t *testing.T, cfg Config) (driver.Store[Tx], error)
	// Effect applies a business effect under key inside tx (e.g. insert a
	// row into a test table); CountEffects counts committed effects under
	// key. Keys are unique per subtest.
	Effect       func(ctx context.Context, tx Tx, key string) error
	CountEffects func(t *testing.T, key string) int
	// Fail runs a statement the database rejects inside tx (for example a
	// division by zero or a duplicate key in a business table): on
	// Postgres it aborts the transaction, which only a savepoint rollback
	// repairs.
	Fail func(ctx context.Context, tx Tx) error
	// BlockWait is how long the concurrency subtest expects a second
	// claimer of a held id to stay blocked. Default: 300ms.
	BlockWait time.Duration
	// Timeout bounds every wait of the suite, so a store that deadlocks
	// fails instead of hanging. Default: 15s.
	Timeout time.Duration
	// Leaser says the store implements driver.Leaser (and its
	// transactions driver.Fencer): the Leases cases then fail, rather
	// than skip, on a store that does not.
	Leaser bool
	// DropLeaseTable drops the lease table of the dedup table named
	// table, as on a database Migrate has not run on since leases came:
	// the WithoutLeaseTable case, run when it is set, checks that claims,
	// Prune, Lookup and Forget still work there.
	DropLeaseTable func(t *testing.T, table string)
	// Retryable tells the errors the ConcurrentBatches subtest retries
	// with a new transaction (deadlocks, lock timeouts), as the Consumer
	// would. Default: none; any error fails the test.
	Retryable func(error) bool
}

// Run runs every conformance subtest against the store h opens.
func Run[Tx any](t *testing.T, h Harness[Tx]) {
	t.Helper()
	if h.Open == nil || h.Effect == nil || h.CountEffects == nil || h.Fail == nil {
		t.Fatal("storetest: Harness.Open, Effect, CountEffects and Fail are required")
	}
	if h.BlockWait <= 0 {
		h.BlockWait = 300 * time.Millisecond
	}
	if h.Timeout <= 0 {
		h.Timeout = 15 * time.Second
	}
	s := suite[Tx]{h: h}
	t.Run("ClaimOnce", s.claimOnce)
	t.Run("BatchMixed", s.batchMixed)
	t.Run("LargeBatch", s.largeBatch)
	t.Run("ConcurrentCommit", func(t *testing.T) { s.concurrent(t, true) })
	t.Run("ConcurrentRollback", func(t *testing.T) { s.concurrent(t, false) })
	t.Run("RollbackReleasesClaim", s.rollbackReleases)
	t.Run("SavepointUnclaim", s.savepointUnclaim)
	t.Run("SavepointAfterDatabaseError", s.savepointAfterDBError)
	t.Run("CommitThenRollback", s.commitThenRollback)
	t.Run("Prune", s.prune)
	t.Run("TableValidation", s.tableValidation)
	t.Run("Fingerprint", s.fingerprint)
	t.Run("ConsumersIndependent", s.consumersIndependent)
	t.Run("MigrateTwice", s.migrateTwice)
	t.Run("OddIDs", s.oddIDs)
	t.Run("ConcurrentBatches", s.concurrentBatches)
	t.Run("Ping", s.ping)
	t.Run("LookupForget", s.lookupForget)
	t.Run("Leases", s.leases)
}

// lookupForget: Lookup reports the claims of one consumer with their time
// and fingerprint, and the rest unclaimed; Forget removes only the given
// consumer's given ids, and a forgotten id is won again.
func (s suite[Tx]) lookupForget(t *testing.T) {
	st, clock := s.open(t)
	ctx := s.ctx(t)
	lk := optional[admin.Lookuper](t, st, "no lookup case")
	fg := optional[admin.Forgetter](t, st, "no forget case")
	at := time.Now().UTC().Truncate(time.Millisecond)
	clock.Set(at)
	k := UniqueName("k_")
	fp := fingerprint([]byte("body"))
	s.claimCommit(t, ctx, st, "billing", []driver.Claim{{ID: "a", Fingerprint: fp}, {ID: "b"}, {ID: "c"}}, k+"billing")
	s.claimCommit(t, ctx, st, "audit", claims("a", "b"), k+"audit")

	check := func(what string, got []admin.ClaimInfo, want ...admin.ClaimInfo) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: got %d infos %+v, want %+v", what, len(got), got, want)
		}
		for i, w := range want {
			g := got[i]
			if g.ID != w.ID || g.Claimed != w.Claimed || g.Fingerprint != w.Fingerprint {
				t.Fatalf("%s: info %d is %+v, want %+v", what, i, g, w)
			}
			if w.Claimed && (g.At.Sub(at) > time.Millisecond || at.Sub(g.At) > time.Millisecond) {
				t.Fatalf("%s: %s claimed at %v, want %v", what, g.ID, g.At, at)
			}
			if !w.Claimed && !g.At.IsZero() {
				t.Fatalf("%s: unclaimed %s has time %v", what, g.ID, g.At)
			}
		}
	}
	lookup := func(consumer string, ids ...string) []admin.ClaimInfo {
		t.Helper()
		got, err := lk.Lookup(ctx, consumer, ids)
		if err != nil {
			t.Fatalf("lookup: %v", err)
		}
		return got
	}
	yes := func(id, fp string) admin.ClaimInfo { return admin.ClaimInfo{ID: id, Claimed: true, Fingerprint: fp} }
	no := func(id string) admin.ClaimInfo { return admin.ClaimInfo{ID: id} }
	check("billing", lookup("billing", "c", "zz", "a", "b"), yes("c", ""), no("zz"), yes("a", fp), yes("b", ""))
	check("audit", lookup("audit", "a", "c"), yes("a", ""), no("c"))
	check("unknown consumer", lookup("nobody", "a"), no("a"))
	check("no ids", lookup("billing"))

	n, err := fg.Forget(ctx, "billing", []string{"a", "zz", "c"})
	if err != nil || n != 2 {
		t.Fatalf("forget: %d, %v; want 2", n, err)
	}
	if n, err := fg.Forget(ctx, "billing", nil); err != nil || n != 0 {
		t.Fatalf("forget of no ids: %d, %v; want 0", n, err)
	}
	check("billing after forget", lookup("billing", "a", "b", "c"), no("a"), yes("b", ""), no("c"))
	check("audit after billing's forget", lookup("audit", "a", "b"), yes("a", ""), yes("b", ""))
	if n, err := fg.Forget(ctx, "billing", []string{"a"}); err != nil || n != 0 {
		t.Fatalf("forget again: %d, %v; want 0", n, err)
	}
	expect(t, "claims after forget", s.claimCommit(t, ctx, st, "billing", claims("a", "b", "c"), k+"billing"),
		driver.ClaimWon, driver.ClaimDuplicate, driver.ClaimWon)
	expect(t, "audit's claims after billing's forget", s.claimCommit(t, ctx, st, "audit", claims("a"), k+"audit"), driver.ClaimDuplicate)
	s.wantEffects(t, k+"billinga", 2)
	s.wantEffects(t, k+"billingb", 1)
	s.wantEffects(t, k+"audita", 1)
	if _, err := lk.Lookup(ctx, "", []string{"a"}); err == nil {
		t.Error("Lookup with an empty consumer must fail")
	}
	if _, err := fg.Forget(ctx, "", []string{"a"}); err == nil {
		t.Error("Forget with an empty consumer must fail")
	}
}

// ping: a store that implements driver.Pinger answers it, and still takes
// claims after it.
func (s suite[Tx]) ping(t *testing.T) {
	st, ctx, k := s.setup(t)
	p := optional[driver.Pinger](t, st, "the Consumer probes it with a transaction")
	if err := p.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	s.claimCommit(t, ctx, st, "c", claims("after-ping"), k)
}

type suite[Tx any] struct{ h Harness[Tx] }

// optional returns st as an I, an interface a store may leave out, or
// skips the case, saying what is skipped, when st does not implement it.
func optional[I any](t *testing.T, st any, skipped string) I {
	t.Helper()
	i, ok := st.(I)
	if !ok {
		t.Skipf("store %T does not implement %v (optional): %s", st, reflect.TypeFor[I](), skipped)
	}
	return i
}

// Clock is a settable clock for Config.Now, safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock showing t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// UniqueName returns prefix followed by 12 random hex digits, for tables,
// keys and consumers that must not collide between parallel or repeated
// test runs.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b)
}

func (s suite[Tx]) open(t *testing.T) (driver.Store[Tx], *Clock) {
	t.Helper()
	clock := NewClock(time.Now())
	st, err := s.h.Open(t, Config{Table: UniqueName("idemq_st_"), Now: clock.Now})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	return st, clock
}

// setup opens a store for one case and returns it with the case's context
// and a fresh prefix for its effect keys.
func (s suite[Tx]) setup(t *testing.T) (driver.Store[Tx], context.Context, string) {
	t.Helper()
	st, _ := s.open(t)
	return st, s.ctx(t), UniqueName("k_")
}

func (s suite[Tx]) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.h.Timeout)
	t.Cleanup(cancel)
	return ctx
}

func begin[Tx any](t *testing.T, ctx context.Context, st driver.Store[Tx]) driver.Txn[Tx] {
	t.Helper()
	txn, err := st.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	// Safe after Commit by contract; releases locks if the test fails early.
	t.Cleanup(func() { _ = txn.Rollback(context.Background()) })
	return txn
}

func claims(ids ...string) []driver.Claim {
	cs := make([]driver.Claim, len(ids))
	for i, id := range ids {
		cs[i] = driver.Claim{ID: id}
	}
	return cs
}

func claim[Tx any](t *testing.T, ctx context.Context, txn driver.Txn[Tx], consumer string, cs []driver.Claim) []driver.ClaimResult {
	t.Helper()
	res, err := txn.Claim(ctx, consumer, cs)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if len(res) != len(cs) {
		t.Fatalf("claim of %d ids returned %d results", len(cs), len(res))
	}
	return res
}

func expect(t *testing.T, what string, got []driver.ClaimResult, want ...driver.ClaimResult) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d results %v, want %v", what, len(got), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: result %d is %v, want %v (all: %v)", what, i, got[i], want[i], got)
		}
	}
}

func commit[Tx any](t *testing.T, ctx context.Context, txn driver.Txn[Tx]) {
	t.Helper()
	if err := txn.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

func rollback[Tx any](t *testing.T, ctx context.Context, txn driver.Txn[Tx]) {
	t.Helper()
	if err := txn.Rollback(ctx); err != nil {
		t.Fatalf("rollback: %v", err)
	}
}

func unclaim[Tx any](t *testing.T, ctx context.Context, txn driver.Txn[Tx], consumer string, ids []string) {
	t.Helper()
	if err := txn.Unclaim(ctx, consumer, ids); err != nil {
		t.Fatalf("unclaim: %v", err)
	}
}

// effect applies the business effect under key in txn.
func (s suite[Tx]) effect(t *testing.T, ctx context.Context, txn driver.Txn[Tx], key string) {
	t.Helper()
	if err := s.h.Effect(ctx, txn.Tx(), key); err != nil {
		t.Fatalf("effect: %v", err)
	}
}

// claimCommit claims ids in a fresh transaction, applies an effect for each
// id it won, commits, and returns the results.
func (s suite[Tx]) claimCommit(t *testing.T, ctx context.Context, st driver.Store[Tx], consumer string, cs []driver.Claim, keyPrefix string) []driver.ClaimResult {
	t.Helper()
	txn := begin(t, ctx, st)
	res := claim(t, ctx, txn, consumer, cs)
	for i, r := range res {
		if r == driver.ClaimWon {
			s.effect(t, ctx, txn, keyPrefix+cs[i].ID)
		}
	}
	commit(t, ctx, txn)
	return res
}

func (s suite[Tx]) wantEffects(t *testing.T, key string, want int) {
	t.Helper()
	if got := s.h.CountEffects(t, key); got != want {
		t.Fatalf("effects under %q: got %d, want %d", key, got, want)
	}
}

func (s suite[Tx]) claimOnce(t *testing.T) {
	st, ctx, k := s.setup(t)
	expect(t, "first claim", s.claimCommit(t, ctx, st, "c", claims("m1"), k), driver.ClaimWon)
	expect(t, "second claim", s.claimCommit(t, ctx, st, "c", claims("m1"), k), driver.ClaimDuplicate)
	s.wantEffects(t, k+"m1", 1)
}

func (s suite[Tx]) batchMixed(t *testing.T) {
	st, ctx, k := s.setup(t)
	expect(t, "seed", s.claimCommit(t, ctx, st, "c", claims("a", "c"), k), driver.ClaimWon, driver.ClaimWon)
	got := s.claimCommit(t, ctx, st, "c", claims("d", "a", "b", "c", "e"), k)
	expect(t, "mixed batch", got, driver.ClaimWon, driver.ClaimDuplicate, driver.ClaimWon, driver.ClaimDuplicate, driver.ClaimWon)
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		s.wantEffects(t, k+id, 1)
	}
}

// largeBatch goes past any per-statement parameter limit a store chunks
// around (SQLite's 999, MySQL's 65535 placeholders).
func (s suite[Tx]) largeBatch(t *testing.T) {
	st, ctx, _ := s.setup(t)
	const n = 1500
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("id-%05d", i)
	}
	// Every third id is claimed first, so the big claim mixes both results
	// across chunk boundaries.
	var seed []string
	for i := 0; i < n; i += 3 {
		seed = append(seed, ids[i])
	}
	txn := begin(t, ctx, st)
	claim(t, ctx, txn, "c", claims(seed...))
	commit(t, ctx, txn)

	txn = begin(t, ctx, st)
	res := claim(t, ctx, txn, "c", claims(ids...))
	for i, r := range res {
		want := driver.ClaimWon
		if i%3 == 0 {
			want = driver.ClaimDuplicate
		}
		if r != want {
			t.Fatalf("id %s: got %v, want %v", ids[i], r, want)
		}
	}
	unclaim(t, ctx, txn, "c", ids[1:])
	commit(t, ctx, txn)

	// Unclaim of ids[1:] removed every claim but ids[0]'s, seeded ones
	// included: a fresh claim wins everything except ids[0].
	txn = begin(t, ctx, st)
	res = claim(t, ctx, txn, "c", claims(ids...))
	for i, r := range res {
		want := driver.ClaimWon
		if i == 0 {
			want = driver.ClaimDuplicate
		}
		if r != want {
			t.Fatalf("after unclaim, id %s: got %v, want %v", ids[i], r, want)
		}
	}
	rollback(t, ctx, txn)
}

// concurrent has two transactions claim the same id: the second must wait
// for the first, then lose (first committed) or win (first rolled back).
// For SQLite the second Begin is what waits.
func (s suite[Tx]) concurrent(t *testing.T, firstCommits bool) {
	st, ctx, k := s.setup(t)

	first := begin(t, ctx, st)
	expect(t, "first claim", claim(t, ctx, first, "c", claims("x")), driver.ClaimWon)
	s.effect(t, ctx, first, k+"x")

	type result struct {
		res []driver.ClaimResult
		err error
	}
	out := make(chan result, 1)
	second := make(chan driver.Txn[Tx], 1)
	go func() {
		txn, err := st.Begin(ctx)
		if err != nil {
			out <- result{err: fmt.Errorf("begin: %w", err)}
			return
		}
		second <- txn
		res, err := txn.Claim(ctx, "c", claims("x"))
		if err == nil && len(res) == 1 && res[0] == driver.ClaimWon {
			err = s.h.Effect(ctx, txn.Tx(), k+"x")
		}
		out <- result{res: res, err: err}
	}()
	var txn2 driver.Txn[Tx]
	defer func() {
		// The second transaction may still be blocked if the test failed;
		// release the first one so it can finish, then roll it back.
		_ = first.Rollback(context.Background())
		if txn2 == nil {
			select {
			case txn2 = <-second:
			case <-time.After(s.h.Timeout):
			}
		}
		if txn2 != nil {
			_ = txn2.Rollback(context.Background())
		}
	}()

	select {
	case r := <-out:
		t.Fatalf("second claimer did not wait for the first transaction: %v %v", r.res, r.err)
	case <-time.After(s.h.BlockWait):
	}

	if firstCommits {
		commit(t, ctx, first)
	} else if err := first.Rollback(ctx); err != nil {
		t.Fatalf("rollback first: %v", err)
	}

	var r result
	select {
	case r = <-out:
	case <-time.After(s.h.Timeout):
		t.Fatalf("second claimer still blocked %v after the first transaction ended", s.h.Timeout)
	}
	if r.err != nil {
		t.Fatalf("second claimer: %v", r.err)
	}
	select {
	case txn2 = <-second:
	case <-time.After(s.h.Timeout):
		t.Fatal("second transaction never began")
	}
	if firstCommits {
		expect(t, "second claim after commit", r.res, driver.ClaimDuplicate)
	} else {
		expect(t, "second claim after rollback", r.res, driver.ClaimWon)
	}
	commit(t, ctx, txn2)
	s.wantEffects(t, k+"x", 1)
}

func (s suite[Tx]) rollbackReleases(t *testing.T) {
	st, ctx, k := s.setup(t)
	txn := begin(t, ctx, st)
	expect(t, "claim", claim(t, ctx, txn, "c", claims("m")), driver.ClaimWon)
	s.effect(t, ctx, txn, k+"m")
	rollback(t, ctx, txn)
	s.wantEffects(t, k+"m", 0)
	// The failed attempt must not have left the id "seen" (the
	// Watermill trap): the redelivery wins and applies the effect.
	expect(t, "redelivery", s.claimCommit(t, ctx, st, "c", claims("m"), k), driver.ClaimWon)
	s.wantEffects(t, k+"m", 1)
}

// savepointUnclaim is the batch path: one claim for three messages, a
// savepoint per message, the second handler fails.
func (s suite[Tx]) savepointUnclaim(t *testing.T) {
	st, ctx, k := s.setup(t)
	ids := []string{"m1", "m2", "m3"}
	txn := begin(t, ctx, st)
	expect(t, "batch claim", claim(t, ctx, txn, "c", claims(ids...)), driver.ClaimWon, driver.ClaimWon, driver.ClaimWon)
	for _, id := range ids {
		var fail func()
		if id == "m2" {
			fail = func() {} // the handler returns an error, having written its effect
		}
		s.inSavepoint(t, ctx, txn, id, k+id, fail)
	}
	// The transaction is still usable after a savepoint rollback.
	if err := s.h.Effect(ctx, txn.Tx(), k+"after"); err != nil {
		t.Fatalf("effect after savepoint rollback: %v", err)
	}
	commit(t, ctx, txn)
	s.wantEffects(t, k+"m1", 1)
	s.wantEffects(t, k+"m2", 0)
	s.wantEffects(t, k+"m3", 1)
	s.wantEffects(t, k+"after", 1)
	got := s.claimCommit(t, ctx, st, "c", claims(ids...), k)
	expect(t, "redelivery of the batch", got, driver.ClaimDuplicate, driver.ClaimWon, driver.ClaimDuplicate)
	s.wantEffects(t, k+"m2", 1)
}

func (s suite[Tx]) commitThenRollback(t *testing.T) {
	st, ctx, k := s.setup(t)
	txn := begin(t, ctx, st)
	claim(t, ctx, txn, "c", claims("m"))
	s.effect(t, ctx, txn, k+"m")
	commit(t, ctx, txn)
	if err := txn.Rollback(ctx); err != nil {
		t.Fatalf("Rollback after Commit must be a no-op, got %v", err)
	}
	s.wantEffects(t, k+"m", 1)
	res, err := func() ([]driver.ClaimResult, error) {
		t2 := begin(t, ctx, st)
		defer t2.Rollback(ctx)
		return t2.Claim(ctx, "c", claims("m"))
	}()
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	expect(t, "claim after commit+rollback", res, driver.ClaimDuplicate)

	// An empty claim is valid and returns no results.
	txn = begin(t, ctx, st)
	if res := claim(t, ctx, txn, "c", nil); len(res) != 0 {
		t.Fatalf("empty claim returned %v", res)
	}
	rollback(t, ctx, txn)
}

func (s suite[Tx]) prune(t *testing.T) {
	st, clock := s.open(t)
	ctx := s.ctx(t)
	pr := optional[admin.Pruner](t, st, "no prune case")
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	// old0..old4 at base-5s..base-1s, edge exactly at base, new at base+1s.
	for i := 0; i < 5; i++ {
		clock.Set(base.Add(time.Duration(i-5) * time.Second))
		s.claimCommit(t, ctx, st, "c", claims(fmt.Sprintf("old%d", i)), "")
	}
	clock.Set(base)
	s.claimCommit(t, ctx, st, "c", claims("edge"), "")
	clock.Set(base.Add(time.Second))
	s.claimCommit(t, ctx, st, "c", claims("new"), "")

	if _, err := pr.Prune(ctx, base, 0); err == nil {
		t.Fatal("Prune with limit 0 must fail")
	}
	var got []int
	for i := 0; i < 5; i++ {
		n, err := pr.Prune(ctx, base, 2)
		if err != nil {
			t.Fatalf("prune: %v", err)
		}
		got = append(got, n)
		if n < 2 {
			break
		}
	}
	if fmt.Sprint(got) != "[2 2 1]" {
		t.Fatalf("prune batches of 2 over 5 old rows removed %v, want [2 2 1]", got)
	}
	if n, err := pr.Prune(ctx, base, 100); err != nil || n != 0 {
		t.Fatalf("prune after draining: %d, %v; want 0", n, err)
	}
	txn := begin(t, ctx, st)
	res := claim(t, ctx, txn, "c", claims("old0", "old3", "old4", "edge", "new"))
	expect(t, "claims after prune", res, driver.ClaimWon, driver.ClaimWon, driver.ClaimWon, driver.ClaimDuplicate, driver.ClaimDuplicate)
	rollback(t, ctx, txn)
	// Pruning at a later cut takes the rest, in one call.
	if n, err := pr.Prune(ctx, base.Add(time.Hour), 100); err != nil || n != 2 {
		t.Fatalf("final prune: %d, %v; want 2", n, err)
	}
}

func (s suite[Tx]) tableValidation(t *testing.T) {
	clock := NewClock(time.Now())
	bad := []string{
		"x; DROP TABLE y", "1abc", "a-b", "", strings.Repeat("a", 64),
		`a"b`, "a'b", "a`b", "a b", "tåble", "a.b",
	}
	for _, name := range bad {
		st, err := s.h.Open(t, Config{Table: name, Now: clock.Now})
		if err == nil {
			t.Errorf("table name %q accepted (store %T)", name, st)
		}
	}
	// The longest valid name works end to end.
	good := UniqueName("t_") + strings.Repeat("x", 63-len("t_")-12)
	st, err := s.h.Open(t, Config{Table: good, Now: clock.Now})
	if err != nil {
		t.Fatalf("valid 63-character table name %q refused: %v", good, err)
	}
	ctx := s.ctx(t)
	expect(t, "claim on 63-char table", s.claimCommit(t, ctx, st, "c", claims("m"), UniqueName("k_")), driver.ClaimWon)
}

func (s suite[Tx]) fingerprint(t *testing.T) {
	st, ctx, k := s.setup(t)
	fp1, fp2 := fingerprint([]byte("one")), fingerprint([]byte("two"))
	s.claimCommit(t, ctx, st, "c", []driver.Claim{{ID: "x", Fingerprint: fp1}, {ID: "nofp"}}, k)
	txn := begin(t, ctx, st)
	res := claim(t, ctx, txn, "c", []driver.Claim{
		{ID: "x", Fingerprint: fp2}, // same id, other body
		{ID: "nofp", Fingerprint: fp2},
		{ID: "fresh", Fingerprint: fp1},
	})
	expect(t, "fingerprints", res, driver.ClaimMismatch, driver.ClaimDuplicate, driver.ClaimWon)
	rollback(t, ctx, txn)
	txn = begin(t, ctx, st)
	res = claim(t, ctx, txn, "c", []driver.Claim{{ID: "x", Fingerprint: fp1}})
	expect(t, "same fingerprint", res, driver.ClaimDuplicate)
	res = claim(t, ctx, txn, "c", []driver.Claim{{ID: "x"}})
	expect(t, "empty fingerprint", res, driver.ClaimDuplicate)
	rollback(t, ctx, txn)
	s.wantEffects(t, k+"x", 1)

	// A claim stored with an older, longer fingerprint (idemq's earlier
	// 64-character hex SHA-256) is not compared with the current one:
	// its redelivery after an upgrade is a duplicate, not a dead letter.
	// Another body with a fingerprint of the old length still is.
	old := strings.Repeat("ab", 32)
	s.claimCommit(t, ctx, st, "c", []driver.Claim{{ID: "legacy", Fingerprint: old}}, k)
	txn = begin(t, ctx, st)
	res = claim(t, ctx, txn, "c", []driver.Claim{{ID: "legacy", Fingerprint: fp2}})
	expect(t, "fingerprint of another length", res, driver.ClaimDuplicate)
	res = claim(t, ctx, txn, "c", []driver.Claim{{ID: "legacy", Fingerprint: strings.Repeat("cd", 32)}})
	expect(t, "other fingerprint of the same length", res, driver.ClaimMismatch)
	rollback(t, ctx, txn)
}

func (s suite[Tx]) consumersIndependent(t *testing.T) {
	st, ctx, k := s.setup(t)
	expect(t, "consumer a", s.claimCommit(t, ctx, st, "billing", claims("m"), k+"a"), driver.ClaimWon)
	expect(t, "consumer b", s.claimCommit(t, ctx, st, "shipping", claims("m"), k+"b"), driver.ClaimWon)
	expect(t, "consumer a again", s.claimCommit(t, ctx, st, "billing", claims("m"), k+"a"), driver.ClaimDuplicate)
	// Unclaim is per consumer too.
	txn := begin(t, ctx, st)
	unclaim(t, ctx, txn, "billing", []string{"m"})
	commit(t, ctx, txn)
	expect(t, "consumer b after a's unclaim", s.claimCommit(t, ctx, st, "shipping", claims("m"), k+"b"), driver.ClaimDuplicate)
	expect(t, "consumer a after unclaim", s.claimCommit(t, ctx, st, "billing", claims("m"), k+"a"), driver.ClaimWon)
	s.wantEffects(t, k+"am", 2)
	s.wantEffects(t, k+"bm", 1)
}

func (s suite[Tx]) migrateTwice(t *testing.T) {
	st, ctx, k := s.setup(t)
	m := optional[admin.Migrator](t, st, "no migrate case")
	s.claimCommit(t, ctx, st, "c", claims("before"), k)
	for i := 0; i < 2; i++ {
		if err := m.Migrate(ctx); err != nil {
			t.Fatalf("migrate #%d: %v", i+1, err)
		}
	}
	// Migrating again keeps the rows.
	expect(t, "after migrate", s.claimCommit(t, ctx, st, "c", claims("before", "after"), k), driver.ClaimDuplicate, driver.ClaimWon)
}

func (s suite[Tx]) oddIDs(t *testing.T) {
	st, ctx, k := s.setup(t)
	ids := []string{
		`it's "quoted"`,
		`'; DROP TABLE x; --`,
		`back\slash%_`,
		"日本語-ü-🙂",
		strings.Repeat("z", 255),
		strings.Repeat("é", 255),
		// Distinct ids the database must not fold together: case, trailing
		// space (PAD SPACE collations), accents.
		"Case", "case", "pad", "pad ", "e", "é",
	}
	consumer := "consumer 'ü\""
	got := s.claimCommit(t, ctx, st, consumer, claims(ids...), k)
	for i, r := range got {
		if r != driver.ClaimWon {
			t.Fatalf("id %q: got %v, want won (all %v)", ids[i], r, got)
		}
	}
	got = s.claimCommit(t, ctx, st, consumer, claims(ids...), k)
	for i, r := range got {
		if r != driver.ClaimDuplicate {
			t.Fatalf("second claim of %q: got %v, want duplicate", ids[i], r)
		}
	}
	// Unclaim matches the exact bytes: only "pad " goes, not "pad".
	txn := begin(t, ctx, st)
	unclaim(t, ctx, txn, consumer, []string{"pad ", ids[0]})
	commit(t, ctx, txn)
	got = s.claimCommit(t, ctx, st, consumer, claims("pad", "pad ", ids[0], ids[1]), k)
	expect(t, "after exact unclaim", got, driver.ClaimDuplicate, driver.ClaimWon, driver.ClaimWon, driver.ClaimDuplicate)
	for _, id := range ids {
		want := 1
		if id == "pad " || id == ids[0] {
			want = 2
		}
		s.wantEffects(t, k+id, want)
	}
}

// concurrentBatches has several workers claim random overlapping batches,
// with a savepoint per message, some handlers failing (savepoint rollback
// and Unclaim) and some whole transactions rolled back; errors the harness
// calls retryable are retried with a new transaction. A final sweep
// processes whatever is left. Every id must end with exactly one committed
// effect.
func (s suite[Tx]) concurrentBatches(t *testing.T) {
	st, ctx, k := s.setup(t)
	const nIDs, workers, rounds, batch = 40, 4, 12, 8
	ids := make([]string, nIDs)
	for i := range ids {
		ids[i] = fmt.Sprintf("m%02d", i)
	}
	var retries atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			r := mrand.New(mrand.NewPCG(seed, seed*7+1))
			for round := 0; round < rounds; round++ {
				pick := make([]driver.Claim, 0, batch)
				for _, i := range r.Perm(nIDs)[:batch] {
					pick = append(pick, driver.Claim{ID: ids[i]})
				}
				for try := 0; ; try++ {
					err := s.randomBatch(ctx, st, pick, r, k)
					if err == nil {
						break
					}
					if s.h.Retryable != nil && s.h.Retryable(err) && try < 50 {
						retries.Add(1)
						continue
					}
					errs <- err
					return
				}
			}
		}(uint64(w) + uint64(time.Now().UnixNano()))
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(4 * s.h.Timeout):
		t.Fatal("concurrent batches did not finish")
	}
	close(errs)
	for err := range errs {
		t.Fatalf("worker: %v", err)
	}
	t.Logf("retried %d transactions", retries.Load())
	s.claimCommit(t, ctx, st, "c", claims(ids...), k)
	for _, id := range ids {
		s.wantEffects(t, k+id, 1)
	}
}

func (s suite[Tx]) randomBatch(ctx context.Context, st driver.Store[Tx], pick []driver.Claim, r *mrand.Rand, k string) (err error) {
	txn, err := st.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = txn.Rollback(ctx)
		}
	}()
	res, err := txn.Claim(ctx, "c", pick)
	if err != nil {
		return err
	}
	if len(res) != len(pick) {
		return fmt.Errorf("claim of %d ids returned %d results", len(pick), len(res))
	}
	for i, c := range pick {
		if res[i] != driver.ClaimWon {
			continue
		}
		if err := savepoints(txn).Savepoint(ctx); err != nil {
			return err
		}
		if err := s.h.Effect(ctx, txn.Tx(), k+c.ID); err != nil {
			return err
		}
		if r.IntN(5) == 0 { // the handler fails
			if err := savepoints(txn).RollbackToSavepoint(ctx); err != nil {
				return err
			}
			if err := txn.Unclaim(ctx, "c", []string{c.ID}); err != nil {
				return err
			}
			continue
		}
		if err := savepoints(txn).ReleaseSavepoint(ctx); err != nil {
			return err
		}
	}
	if r.IntN(10) == 0 { // the commit never happens (crash, shutdown)
		return txn.Rollback(ctx)
	}
	return txn.Commit(ctx)
}

// savepointAfterDBError: a handler's statement fails in the database
// (which aborts a Postgres transaction); rolling back to the savepoint
// repairs the transaction, so the other messages of the batch commit.
// Catching the error without the savepoint is the Camel bug.
func (s suite[Tx]) savepointAfterDBError(t *testing.T) {
	st, ctx, k := s.setup(t)
	txn := begin(t, ctx, st)
	expect(t, "batch claim", claim(t, ctx, txn, "c", claims("ok1", "bad", "ok2")), driver.ClaimWon, driver.ClaimWon, driver.ClaimWon)
	for _, id := range []string{"ok1", "bad", "ok2"} {
		var fail func()
		if id == "bad" {
			fail = func() {
				if err := s.h.Fail(ctx, txn.Tx()); err == nil {
					t.Fatal("Harness.Fail returned no error")
				}
			}
		}
		s.inSavepoint(t, ctx, txn, id, k+id, fail)
	}
	commit(t, ctx, txn)
	s.wantEffects(t, k+"ok1", 1)
	s.wantEffects(t, k+"bad", 0)
	s.wantEffects(t, k+"ok2", 1)
	got := s.claimCommit(t, ctx, st, "c", claims("ok1", "bad", "ok2"), k)
	expect(t, "redelivery", got, driver.ClaimDuplicate, driver.ClaimWon, driver.ClaimDuplicate)
}

// inSavepoint runs the handler of message id in a savepoint of txn, as the
// Consumer's batch path does: the effect under key, then, when fail is
// nil, the release of the savepoint; otherwise fail (what else the failing
// handler does), the rollback to the savepoint and the Unclaim of id.
func (s suite[Tx]) inSavepoint(t *testing.T, ctx context.Context, txn driver.Txn[Tx], id, key string, fail func()) {
	t.Helper()
	sp := savepoints(txn)
	if err := sp.Savepoint(ctx); err != nil {
		t.Fatalf("savepoint before %s: %v", id, err)
	}
	if err := s.h.Effect(ctx, txn.Tx(), key); err != nil {
		t.Fatalf("effect %s: %v", id, err)
	}
	if fail == nil {
		if err := sp.ReleaseSavepoint(ctx); err != nil {
			t.Fatalf("release savepoint after %s: %v", id, err)
		}
		return
	}
	fail()
	if err := sp.RollbackToSavepoint(ctx); err != nil {
		t.Fatalf("rollback to savepoint after %s failed: %v", id, err)
	}
	unclaim(t, ctx, txn, "c", []string{id})
}

// savepoints returns txn as a driver.Savepointer: the suite's savepoint
// cases need it, and every store it runs on has savepoints.
func savepoints(txn any) driver.Savepointer {
	sp, ok := txn.(driver.Savepointer)
	if !ok {
		panic(fmt.Sprintf("storetest: %T is no driver.Savepointer", txn))
	}
	return sp
}

// fingerprint stands for a consumer's body fingerprint: what a store keeps
// beside a claim and compares, 22 characters as the Consumer's default.
func fingerprint(body []byte) string {
	sum := sha256.Sum256(body)
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}
