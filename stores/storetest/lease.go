package storetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
)

// leases runs the cases of leased claims (driver.Leaser, driver.Fencer):
// a claim in progress outside any transaction, with an expiry and a
// fencing token, that a completion transaction ends.
func (s suite[Tx]) leases(t *testing.T) {
	t.Run("AcquireBusyTakeOver", s.leaseTakeOver)
	t.Run("FenceCompletes", s.leaseFence)
	t.Run("Release", s.leaseRelease)
	t.Run("Prune", s.leasePrune)
	t.Run("ConcurrentAcquire", s.leaseConcurrent)
	t.Run("AcquireWaitsForFence", s.leaseWaitsForFence)
	t.Run("MigrateTwice", s.leaseMigrateTwice)
	t.Run("TableTooLong", s.leaseTableTooLong)
	t.Run("WithoutLeaseTable", s.withoutLeaseTable)
}

// leaser returns st as a driver.Leaser: a store the Harness says leases
// fails the test when it does not, any other skips it.
func (s suite[Tx]) leaser(t *testing.T, st driver.Store[Tx]) driver.Leaser {
	t.Helper()
	l, ok := st.(driver.Leaser)
	switch {
	case !ok && s.h.Leaser:
		t.Fatalf("store %T does not implement driver.Leaser, which Harness.Leaser promises", st)
	case !ok:
		t.Skipf("store %T does not implement driver.Leaser (optional): no lease case", st)
	}
	txn := begin(t, s.ctx(t), st)
	_, fences := txn.(driver.Fencer)
	rollback(t, s.ctx(t), txn)
	if !fences {
		t.Fatalf("the transactions of Leaser store %T do not implement driver.Fencer", st)
	}
	return l
}

// openLeaser opens a store whose clock shows a time of its own, to the
// millisecond (every store keeps that precision).
func (s suite[Tx]) openLeaser(t *testing.T) (driver.Store[Tx], driver.Leaser, *Clock, time.Time) {
	t.Helper()
	st, clock := s.open(t)
	base := time.Now().UTC().Truncate(time.Millisecond)
	clock.Set(base)
	return st, s.leaser(t, st), clock, base
}

func acquire(t *testing.T, ctx context.Context, l driver.Leaser, id, fp string, ttl time.Duration) driver.Lease {
	t.Helper()
	lease, err := l.Acquire(ctx, "c", driver.Claim{ID: id, Fingerprint: fp}, ttl)
	if err != nil {
		t.Fatalf("acquire %s: %v", id, err)
	}
	return lease
}

func wantLease(t *testing.T, what string, got driver.Lease, want driver.LeaseResult, until time.Time) {
	t.Helper()
	if got.Result != want || !sameTime(got.Until, until) {
		t.Fatalf("%s: %+v, want %v until %v", what, got, want, until)
	}
	if want == driver.LeaseWon && got.Token < 1 {
		t.Fatalf("%s: won with token %d, want at least 1", what, got.Token)
	}
}

// sameTime compares times of the store, which keeps microseconds.
func sameTime(a, b time.Time) bool {
	d := a.Sub(b)
	return a.IsZero() == b.IsZero() && d < time.Millisecond && d > -time.Millisecond
}

func renew(t *testing.T, ctx context.Context, l driver.Leaser, ttl time.Duration, refs ...driver.LeaseRef) string {
	t.Helper()
	held, err := l.Renew(ctx, "c", refs, ttl)
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	if len(held) != len(refs) {
		t.Fatalf("renew of %d leases answered %v", len(refs), held)
	}
	return fmt.Sprint(held)
}

func fence[Tx any](t *testing.T, ctx context.Context, txn driver.Txn[Tx], refs ...driver.LeaseRef) string {
	t.Helper()
	held, err := txn.(driver.Fencer).Fence(ctx, "c", refs)
	if err != nil {
		t.Fatalf("fence: %v", err)
	}
	if len(held) != len(refs) {
		t.Fatalf("fence of %d leases answered %v", len(refs), held)
	}
	return fmt.Sprint(held)
}

// must returns st as an I, an optional interface that every Leaser store
// implements.
func must[I any](t *testing.T, st any) I {
	t.Helper()
	i, ok := st.(I)
	if !ok {
		t.Fatalf("Leaser store %T does not implement %T", st, (*I)(nil))
	}
	return i
}

// leaseInfo looks id up for consumer c.
func (s suite[Tx]) leaseInfo(t *testing.T, ctx context.Context, st driver.Store[Tx], id string) admin.ClaimInfo {
	t.Helper()
	infos, err := must[admin.Lookuper](t, st).Lookup(ctx, "c", []string{id})
	if err != nil || len(infos) != 1 {
		t.Fatalf("lookup %s: %v, %v", id, infos, err)
	}
	return infos[0]
}

// leaseTakeOver: the first Acquire wins, a second one while the lease
// lives is busy until its expiry, one after the expiry takes it over under
// a new token; Renew answers by token and moves the expiry.
func (s suite[Tx]) leaseTakeOver(t *testing.T) {
	st, l, clock, base := s.openLeaser(t)
	ctx := s.ctx(t)
	const ttl = 10 * time.Second
	first := acquire(t, ctx, l, "m", "", ttl)
	wantLease(t, "first acquire", first, driver.LeaseWon, base.Add(ttl))
	if first.TakenOver {
		t.Fatalf("first acquire reports a takeover: %+v", first)
	}
	clock.Set(base.Add(ttl / 2))
	wantLease(t, "acquire of a live lease", acquire(t, ctx, l, "m", "", ttl), driver.LeaseBusy, base.Add(ttl))
	wantLease(t, "another id", acquire(t, ctx, l, "other", "", ttl), driver.LeaseWon, base.Add(ttl/2+ttl))

	clock.Set(base.Add(ttl + time.Second))
	second := acquire(t, ctx, l, "m", "", ttl)
	wantLease(t, "acquire after the expiry", second, driver.LeaseWon, base.Add(2*ttl+time.Second))
	if !second.TakenOver || second.Token == first.Token {
		t.Fatalf("takeover %+v after %+v: want TakenOver and a new token", second, first)
	}
	old, cur := driver.LeaseRef{ID: "m", Token: first.Token}, driver.LeaseRef{ID: "m", Token: second.Token}
	clock.Set(base.Add(ttl + 2*time.Second))
	if got := renew(t, ctx, l, ttl, old); got != "[false]" {
		t.Fatalf("renew with the old token: %s, want [false]", got)
	}
	if got := renew(t, ctx, l, ttl, cur, old, driver.LeaseRef{ID: "none", Token: 1}); got != "[true false false]" {
		t.Fatalf("renew of the new, old and no token: %s, want [true false false]", got)
	}
	if got := renew(t, ctx, l, ttl); got != "[]" {
		t.Fatalf("renew of nothing: %s", got)
	}
	info := s.leaseInfo(t, ctx, st, "m")
	if info.Claimed || info.LeaseToken != second.Token || !sameTime(info.LeaseUntil, base.Add(2*ttl+2*time.Second)) {
		t.Fatalf("lookup after renew: %+v, want token %d until %v", info, second.Token, base.Add(2*ttl+2*time.Second))
	}
	// An expired lease no one took over is still held, and renewed.
	clock.Set(base.Add(10 * ttl))
	if got := renew(t, ctx, l, ttl, cur); got != "[true]" {
		t.Fatalf("renew of an expired lease not taken over: %s, want [true]", got)
	}
	wantLease(t, "acquire after the late renew", acquire(t, ctx, l, "m", "", ttl), driver.LeaseBusy, base.Add(11*ttl))
}

// leaseFence: a completion transaction whose token was taken over is
// fenced off (and its Unclaim leaves no claim); the holder's completes,
// after which Acquire finds the completed claim and leaves no lease.
func (s suite[Tx]) leaseFence(t *testing.T) {
	st, l, clock, base := s.openLeaser(t)
	ctx := s.ctx(t)
	k := UniqueName("k_")
	fp, other := fingerprint([]byte("one")), fingerprint([]byte("two"))
	const ttl = time.Minute
	stale := acquire(t, ctx, l, "m", fp, ttl)
	clock.Set(base.Add(2 * ttl))
	live := acquire(t, ctx, l, "m", fp, ttl)
	wantLease(t, "takeover", live, driver.LeaseWon, base.Add(3*ttl))

	txn := begin(t, ctx, st)
	expect(t, "stale holder's claim", claim(t, ctx, txn, "c", []driver.Claim{{ID: "m", Fingerprint: fp}}), driver.ClaimWon)
	if got := fence(t, ctx, txn, driver.LeaseRef{ID: "m", Token: stale.Token}); got != "[false]" {
		t.Fatalf("fence with the stale token: %s, want [false]", got)
	}
	unclaim(t, ctx, txn, "c", []string{"m"})
	commit(t, ctx, txn)
	if info := s.leaseInfo(t, ctx, st, "m"); info.Claimed || info.LeaseToken != live.Token {
		t.Fatalf("after the stale completion: %+v, want no claim and the live lease", info)
	}

	txn = begin(t, ctx, st)
	expect(t, "holder's claim", claim(t, ctx, txn, "c", []driver.Claim{{ID: "m", Fingerprint: fp}}), driver.ClaimWon)
	if got := fence(t, ctx, txn, driver.LeaseRef{ID: "m", Token: live.Token}, driver.LeaseRef{ID: "none", Token: live.Token}); got != "[true false]" {
		t.Fatalf("fence with the live token: %s, want [true false]", got)
	}
	if got := fence(t, ctx, txn); got != "[]" {
		t.Fatalf("fence of nothing: %s", got)
	}
	s.effect(t, ctx, txn, k+"m")
	commit(t, ctx, txn)
	wantLease(t, "acquire after completion", acquire(t, ctx, l, "m", fp, ttl), driver.LeaseDone, time.Time{})
	wantLease(t, "acquire with another body", acquire(t, ctx, l, "m", other, ttl), driver.LeaseMismatch, time.Time{})
	wantLease(t, "acquire without fingerprint", acquire(t, ctx, l, "m", "", ttl), driver.LeaseDone, time.Time{})
	if info := s.leaseInfo(t, ctx, st, "m"); !info.Claimed || !info.LeaseUntil.IsZero() || info.LeaseToken != 0 {
		t.Fatalf("after completion: %+v, want a claim and no lease", info)
	}
	s.wantEffects(t, k+"m", 1)
}

// leaseRelease: Release with a wrong token keeps the lease; with the right
// one the next Acquire wins at once, as a first claim; releasing what is
// gone is no error.
func (s suite[Tx]) leaseRelease(t *testing.T) {
	st, l, _, base := s.openLeaser(t)
	ctx := s.ctx(t)
	lease := acquire(t, ctx, l, "m", "", time.Hour)
	if err := l.Release(ctx, "c", driver.LeaseRef{ID: "m", Token: lease.Token + 1}); err != nil {
		t.Fatalf("release with another token: %v", err)
	}
	wantLease(t, "after a release with another token", acquire(t, ctx, l, "m", "", time.Hour), driver.LeaseBusy, base.Add(time.Hour))
	if err := l.Release(ctx, "c", driver.LeaseRef{ID: "m", Token: lease.Token}); err != nil {
		t.Fatalf("release: %v", err)
	}
	if info := s.leaseInfo(t, ctx, st, "m"); !info.LeaseUntil.IsZero() {
		t.Fatalf("lookup after release: %+v", info)
	}
	again := acquire(t, ctx, l, "m", "", time.Hour)
	wantLease(t, "acquire after release", again, driver.LeaseWon, base.Add(time.Hour))
	if again.TakenOver {
		t.Fatalf("acquire after release reports a takeover: %+v", again)
	}
	if err := l.Release(ctx, "c", driver.LeaseRef{ID: "m", Token: lease.Token}); err != nil {
		t.Fatalf("release of a gone lease: %v", err)
	}
	if got := renew(t, ctx, l, time.Hour, driver.LeaseRef{ID: "m", Token: again.Token}); got != "[true]" {
		t.Fatalf("renew after a stale release: %s, want [true]", got)
	}
}

// leasePrune: Prune removes expired leases but no live one, whatever the
// time it is given.
func (s suite[Tx]) leasePrune(t *testing.T) {
	st, l, clock, base := s.openLeaser(t)
	ctx := s.ctx(t)
	pr := must[admin.Pruner](t, st)
	clock.Set(base.Add(-2 * time.Hour))
	acquire(t, ctx, l, "old", "", time.Second)
	clock.Set(base)
	live := acquire(t, ctx, l, "live", "", time.Hour)
	n, err := pr.Prune(ctx, base.Add(1000*time.Hour), 100)
	if err != nil || n != 1 {
		t.Fatalf("prune far in the future: %d, %v; want the one expired lease", n, err)
	}
	if info := s.leaseInfo(t, ctx, st, "old"); !info.LeaseUntil.IsZero() {
		t.Fatalf("expired lease left: %+v", info)
	}
	if info := s.leaseInfo(t, ctx, st, "live"); info.LeaseToken != live.Token {
		t.Fatalf("live lease pruned: %+v", info)
	}
	if n, err := pr.Prune(ctx, base.Add(1000*time.Hour), 100); err != nil || n != 0 {
		t.Fatalf("prune again: %d, %v; want 0", n, err)
	}
}

// leaseConcurrent: of two Acquires of one id at once, exactly one wins.
func (s suite[Tx]) leaseConcurrent(t *testing.T) {
	_, l, _, _ := s.openLeaser(t)
	ctx := s.ctx(t)
	for round := range 50 {
		id := fmt.Sprintf("r%d", round)
		var wg sync.WaitGroup
		var results [2]driver.Lease
		var errs [2]error
		start := make(chan struct{})
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i], errs[i] = l.Acquire(ctx, "c", driver.Claim{ID: id}, time.Minute)
			}()
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: acquire: %v", round, err)
			}
		}
		won := 0
		for _, r := range results {
			switch r.Result {
			case driver.LeaseWon:
				won++
			case driver.LeaseBusy:
			default:
				t.Fatalf("round %d: %+v", round, results)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d of 2 concurrent acquires won: %+v", round, won, results)
		}
	}
}

// leaseWaitsForFence: an Acquire racing a completion transaction that
// fenced the lease and has not committed waits for it, then finds the
// completed claim.
func (s suite[Tx]) leaseWaitsForFence(t *testing.T) {
	st, l, clock, base := s.openLeaser(t)
	ctx := s.ctx(t)
	const ttl = time.Minute
	lease := acquire(t, ctx, l, "m", "", ttl)
	txn := begin(t, ctx, st)
	expect(t, "completion claim", claim(t, ctx, txn, "c", claims("m")), driver.ClaimWon)
	if got := fence(t, ctx, txn, driver.LeaseRef{ID: "m", Token: lease.Token}); got != "[true]" {
		t.Fatalf("fence: %s", got)
	}
	clock.Set(base.Add(2 * ttl)) // the lease would have expired
	type result struct {
		lease driver.Lease
		err   error
	}
	out := make(chan result, 1)
	go func() {
		r, err := l.Acquire(ctx, "c", driver.Claim{ID: "m"}, ttl)
		out <- result{r, err}
	}()
	select {
	case r := <-out:
		t.Fatalf("acquire did not wait for the fencing transaction: %+v, %v", r.lease, r.err)
	case <-time.After(s.h.BlockWait):
	}
	commit(t, ctx, txn)
	select {
	case r := <-out:
		if r.err != nil {
			t.Fatalf("acquire: %v", r.err)
		}
		wantLease(t, "acquire after the completion", r.lease, driver.LeaseDone, time.Time{})
	case <-time.After(s.h.Timeout):
		t.Fatalf("acquire still blocked %v after the commit", s.h.Timeout)
	}
	if info := s.leaseInfo(t, ctx, st, "m"); !info.Claimed || !info.LeaseUntil.IsZero() {
		t.Fatalf("after completion: %+v, want a claim and no lease", info)
	}
}

// leaseMigrateTwice: Migrate again keeps the leases, and its lease table
// takes new ones.
func (s suite[Tx]) leaseMigrateTwice(t *testing.T) {
	st, l, _, _ := s.openLeaser(t)
	ctx := s.ctx(t)
	m := must[admin.Migrator](t, st)
	before := acquire(t, ctx, l, "before", "", time.Hour)
	for i := range 2 {
		if err := m.Migrate(ctx); err != nil {
			t.Fatalf("migrate #%d: %v", i+1, err)
		}
	}
	if got := renew(t, ctx, l, time.Hour, driver.LeaseRef{ID: "before", Token: before.Token}); got != "[true]" {
		t.Fatalf("lease after migrate: %s", got)
	}
	wantLease(t, "acquire after migrate", acquire(t, ctx, l, "after", "", time.Hour), driver.LeaseWon, before.Until)
}

// leaseTableTooLong: a table name that leaves no room for its lease
// table's suffix still stores claims, and Acquire fails naming the table
// option; the longest name that leaves room leases.
func (s suite[Tx]) leaseTableTooLong(t *testing.T) {
	ctx := s.ctx(t)
	clock := NewClock(time.Now())
	const room = 63 - len("_leases")
	for _, n := range []int{room + 1, room} {
		name := UniqueName("t_") + strings.Repeat("x", n-len("t_")-12)
		st, err := s.h.Open(t, Config{Table: name, Now: clock.Now})
		if err != nil {
			t.Fatalf("open with a %d-character table name: %v", n, err)
		}
		l := s.leaser(t, st)
		lease, err := l.Acquire(ctx, "c", driver.Claim{ID: "m"}, time.Hour)
		if n > room {
			if err == nil || !strings.Contains(err.Error(), "WithTable") {
				t.Fatalf("acquire on a %d-character table: %+v, %v; want an error naming WithTable", n, lease, err)
			}
			expect(t, "claim on the long table", s.claimCommit(t, ctx, st, "c", claims("m"), UniqueName("k_")), driver.ClaimWon)
			if info := s.leaseInfo(t, ctx, st, "m"); !info.Claimed {
				t.Fatalf("lookup on the long table: %+v", info)
			}
			continue
		}
		if err != nil || lease.Result != driver.LeaseWon {
			t.Fatalf("acquire on a %d-character table: %+v, %v", n, lease, err)
		}
	}
}

// withoutLeaseTable: a store whose lease table is gone (Migrate has not
// run since leases came) claims, prunes, looks up and forgets as before;
// only Acquire fails.
func (s suite[Tx]) withoutLeaseTable(t *testing.T) {
	if s.h.DropLeaseTable == nil {
		t.Skip("Harness.DropLeaseTable is not set")
	}
	table := UniqueName("idemq_st_")
	clock := NewClock(time.Now())
	st, err := s.h.Open(t, Config{Table: table, Now: clock.Now})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	l := s.leaser(t, st)
	s.h.DropLeaseTable(t, table)
	ctx := s.ctx(t)
	s.claimCommit(t, ctx, st, "c", claims("a", "b"), UniqueName("k_"))
	if info := s.leaseInfo(t, ctx, st, "a"); !info.Claimed {
		t.Fatalf("lookup: %+v", info)
	}
	if n, err := must[admin.Forgetter](t, st).Forget(ctx, "c", []string{"a"}); err != nil || n != 1 {
		t.Fatalf("forget: %d, %v", n, err)
	}
	if n, err := must[admin.Pruner](t, st).Prune(ctx, clock.Now().Add(time.Hour), 100); err != nil || n != 1 {
		t.Fatalf("prune: %d, %v", n, err)
	}
	if lease, err := l.Acquire(ctx, "c", driver.Claim{ID: "x"}, time.Hour); err == nil {
		t.Fatalf("acquire without a lease table: %+v", lease)
	}
}
