package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/storetest"
	"github.com/jackc/pgx/v5"
)

// Twenty concurrent copies of one request: one effect, and every answer
// is the stored response or 409 with Retry-After.
func TestConcurrentRetries(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		order := storetest.UniqueName("o")
		biz := f.orders()
		url := serve(t, f.handler(func(w http.ResponseWriter, r *http.Request, ex execFunc) error {
			time.Sleep(20 * time.Millisecond) // keep the key in progress while the copies arrive
			return biz(w, r, ex)
		}))
		body := `{"order":"` + order + `"}`
		const n = 20
		answers := make([]answer, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				var err error
				if answers[i], err = tryPost(url, `"k-`+order+`"`, body); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		final := post(t, url, `"k-`+order+`"`, body)
		if final.status != http.StatusCreated || final.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry after all: %d %v %s", final.status, final.header, final.body)
		}
		created, busy := 0, 0
		for _, a := range answers {
			switch a.status {
			case http.StatusCreated:
				created++
				if a.body != final.body {
					t.Fatalf("answer %q differs from the stored response %q", a.body, final.body)
				}
			case http.StatusConflict:
				busy++
				problemOf(t, a, http.StatusConflict)
				if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < 1 {
					t.Fatalf("409 with Retry-After %q", a.header.Get("Retry-After"))
				}
			default:
				t.Fatalf("answer %d: %s", a.status, a.body)
			}
		}
		if created == 0 {
			t.Fatal("no request got the response")
		}
		if got := f.count(order); got != 1 {
			t.Fatalf("%d effects, want 1 (%d created, %d busy)", got, created, busy)
		}
		t.Logf("%d created, %d busy", created, busy)
	})
}

// A response the handler wrote itself (402) is committed, stored and
// replayed; the replay carries the stored headers only, marked.
func TestReplayOfStoredError(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		order := storetest.UniqueName("o")
		url := serve(t, f.handler(func(w http.ResponseWriter, r *http.Request, ex execFunc) error {
			if err := ex(f.insert, order); err != nil { // e.g. a declined-payment record
				return err
			}
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("X-Not-Stored", "1")
			w.WriteHeader(http.StatusPaymentRequired)
			fmt.Fprint(w, `{"title":"card declined","status":402}`)
			return nil
		}))
		first := post(t, url, "k-"+order, `{}`) // unquoted, Stripe style
		again := post(t, url, `"k-`+order+`"`, `{}`)
		if first.status != http.StatusPaymentRequired || again.status != http.StatusPaymentRequired || first.body != again.body {
			t.Fatalf("first %d %q, replay %d %q", first.status, first.body, again.status, again.body)
		}
		if first.header.Get("Idempotent-Replayed") != "" || first.header.Get("X-Not-Stored") != "1" {
			t.Fatalf("first answer headers %v", first.header)
		}
		if again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("X-Not-Stored") != "" ||
			again.header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("replay headers %v", again.header)
		}
		if got := f.count(order); got != 1 {
			t.Fatalf("%d effects, want 1", got)
		}
	})
}

// The same key with another body, or another query, is answered 422 and
// applies nothing.
func TestMismatch(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		order, other := storetest.UniqueName("o"), storetest.UniqueName("o")
		url := serve(t, f.handler(f.orders()))
		key := `"k-` + order + `"`
		if a := post(t, url, key, `{"order":"`+order+`"}`); a.status != http.StatusCreated {
			t.Fatalf("first: %d %s", a.status, a.body)
		}
		problemOf(t, post(t, url, key, `{"order":"`+other+`"}`), http.StatusUnprocessableEntity)
		problemOf(t, post(t, url+"?x=1", key, `{"order":"`+order+`"}`), http.StatusUnprocessableEntity)
		if a, b := f.count(order), f.count(other); a != 1 || b != 0 {
			t.Fatalf("effects %d and %d, want 1 and 0", a, b)
		}
	})
}

// A missing or malformed key is answered 400 before the handler runs;
// with WithKeyOptional a request without a key runs as a plain
// transaction every time.
func TestMissingAndMalformedKey(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		order := storetest.UniqueName("o")
		url := serve(t, f.handler(f.orders()))
		body := `{"order":"` + order + `"}`
		problemOf(t, post(t, url, "", body), http.StatusBadRequest)
		for _, k := range []string{`""`, `"unterminated`, `"a"b`, `a b`, `"é"`, `"` + strings.Repeat("x", MaxKeyLength+1) + `"`} {
			p := problemOf(t, post(t, url, k, body), http.StatusBadRequest)
			if !strings.Contains(p.Type, "malformed") {
				t.Fatalf("key %q: %+v", k, p)
			}
		}
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Add(HeaderKey, `"a"`)
		req.Header.Add(HeaderKey, `"b"`)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Fatalf("two keys: %d", res.StatusCode)
		}
		if got := f.count(order); got != 0 {
			t.Fatalf("%d effects, want 0", got)
		}
	})
	t.Run("optional", func(t *testing.T) {
		f := open(t, "sqlite", newNames(t), true, WithKeyOptional())
		order := storetest.UniqueName("o")
		url := serve(t, f.handler(f.orders()))
		for range 2 {
			if a := post(t, url, "", `{"order":"`+order+`"}`); a.status != http.StatusCreated {
				t.Fatalf("%d %s", a.status, a.body)
			}
		}
		if got := f.count(order); got != 2 {
			t.Fatalf("%d effects without a key, want 2", got)
		}
	})
}

// While a request's handler runs, a copy is answered 409 with
// Retry-After; once it committed, copies get its response.
func TestInProgress(t *testing.T) {
	for _, b := range []string{"postgres", "mysql"} { // SQLite's writer lock makes a copy wait instead (held lease below)
		t.Run(b, func(t *testing.T) {
			f := open(t, b, newNames(t), true)
			order := storetest.UniqueName("o")
			url, body, first, unblock := f.blockedFirst(t, order)
			a := post(t, url, "k-"+order, body)
			problemOf(t, a, http.StatusConflict)
			if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < 1 || s > int(DefaultLease/time.Second) {
				t.Fatalf("Retry-After %q", a.header.Get("Retry-After"))
			}
			close(unblock)
			if a := <-first; a.status != http.StatusCreated {
				t.Fatalf("first: %d %s", a.status, a.body)
			}
			if a := post(t, url, "k-"+order, body); a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("after: %d %s", a.status, a.body)
			}
			if got := f.count(order); got != 1 {
				t.Fatalf("%d effects, want 1", got)
			}
		})
	}
	t.Run("held lease", func(t *testing.T) {
		each(t, func(t *testing.T, f *fixture) {
			if f.backend == "postgres" {
				heldLock(t, f)
				return
			}
			order := storetest.UniqueName("o")
			ctx := context.Background()
			l, err := f.leaser.Acquire(ctx, DefaultName, driver.Claim{ID: ordersID("k-" + order)}, time.Hour)
			if err != nil || l.Result != driver.LeaseWon {
				t.Fatal(l, err)
			}
			url := serve(t, f.handler(f.orders()))
			a := post(t, url, "k-"+order, `{"order":"`+order+`"}`)
			problemOf(t, a, http.StatusConflict)
			if s, _ := strconv.Atoi(a.header.Get("Retry-After")); s < 3500 {
				t.Fatalf("Retry-After %q for a lease of an hour", a.header.Get("Retry-After"))
			}
			if err := f.leaser.Release(ctx, DefaultName, driver.LeaseRef{ID: ordersID("k-" + order), Token: l.Token}); err != nil {
				t.Fatal(err)
			}
			if a := post(t, url, "k-"+order, `{"order":"`+order+`"}`); a.status != http.StatusCreated {
				t.Fatalf("after the release: %d %s", a.status, a.body)
			}
			if got := f.count(order); got != 1 {
				t.Fatalf("%d effects, want 1", got)
			}
		})
	})
}

// A holder that crashed leaves a lease that expires: the next request
// takes the key over and runs, and the old holder's fence fails, so it
// could not complete the key if it came back. On Postgres see
// deadLockHolder.
func TestLeaseTakeover(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		if f.backend == "postgres" {
			deadLockHolder(t, f)
			return
		}
		order := storetest.UniqueName("o")
		ctx := context.Background()
		id := ordersID("k-" + order)
		old, err := f.leaser.Acquire(ctx, DefaultName, driver.Claim{ID: id}, 50*time.Millisecond)
		if err != nil || old.Result != driver.LeaseWon {
			t.Fatal(old, err)
		}
		time.Sleep(time.Until(old.Until) + 20*time.Millisecond) // the holder never renews: its lease runs out
		url := serve(t, f.handler(f.orders()))
		if a := post(t, url, "k-"+order, `{"order":"`+order+`"}`); a.status != http.StatusCreated {
			t.Fatalf("takeover: %d %s", a.status, a.body)
		}
		txn, err := f.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held, err := txn.Fence(ctx, DefaultName, []driver.LeaseRef{{ID: id, Token: old.Token}})
		txn.Rollback(ctx)
		if err != nil || len(held) != 1 || held[0] {
			t.Fatalf("the crashed holder's fence: %v %v", held, err)
		}
		if got := f.count(order); got != 1 {
			t.Fatalf("%d effects, want 1", got)
		}
	})
}

// A handler error rolls back and frees the key: 500, nothing stored, and
// the retry runs at once; a panic does the same and goes on up.
func TestHandlerErrorAndPanic(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		order := storetest.UniqueName("o")
		var mu sync.Mutex
		fail := []string{"error", "panic"}
		biz := f.orders()
		h := f.handler(func(w http.ResponseWriter, r *http.Request, ex execFunc) error {
			if err := ex(f.insert, order); err != nil { // an effect that must roll back
				return err
			}
			mu.Lock()
			var next string
			if len(fail) > 0 {
				next, fail = fail[0], fail[1:]
			}
			mu.Unlock()
			switch next {
			case "error":
				w.WriteHeader(http.StatusTeapot) // discarded
				return errors.New("boom")
			case "panic":
				panic(http.ErrAbortHandler) // net/http closes the connection quietly
			}
			return biz(w, r, ex)
		})
		url := serve(t, h)
		body := `{"order":"` + order + `"}`
		problemOf(t, post(t, url, "k-"+order, body), http.StatusInternalServerError)
		if _, err := tryPost(url, "k-"+order, body); err == nil {
			t.Fatal("the panicking request got an answer")
		}
		if got := f.count(order); got != 0 {
			t.Fatalf("%d effects after the failures, want 0", got)
		}
		if a := post(t, url, "k-"+order, body); a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry: %d %v %s", a.status, a.header, a.body)
		}
		if got := f.count(order); got != 2 { // the handler's own row, then orders'
			t.Fatalf("%d effects, want 2", got)
		}
	})
}

// Prune deletes stored responses: a key whose claim remains is answered
// 410; once the store pruned the claim too, the key is new again.
func TestPrune(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		order := storetest.UniqueName("o")
		ctx := context.Background()
		url := serve(t, f.handler(f.orders()))
		body := `{"order":"` + order + `"}`
		if a := post(t, url, "k-"+order, body); a.status != http.StatusCreated {
			t.Fatalf("%d %s", a.status, a.body)
		}
		if n, err := f.prune(ctx, time.Now().Add(-time.Hour), 10); err != nil || n != 0 {
			t.Fatalf("prune of older responses: %d %v", n, err)
		}
		if n, err := f.prune(ctx, time.Now().Add(time.Second), 10); err != nil || n != 1 {
			t.Fatalf("prune: %d %v", n, err)
		}
		problemOf(t, post(t, url, "k-"+order, body), http.StatusGone)
		if _, err := f.pruneClaims(ctx, time.Now().Add(time.Second), 10); err != nil {
			t.Fatal(err)
		}
		if a := post(t, url, "k-"+order, body); a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("after the claim's prune: %d %s", a.status, a.body)
		}
		if a := post(t, url, "k-"+order, body); a.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay after the rerun: %d %s", a.status, a.body)
		}
		if got := f.count(order); got != 2 {
			t.Fatalf("%d effects, want 2", got)
		}
	})
}

// A handler that runs longer than the lease keeps its key: the lease is
// renewed (on Postgres the transaction's lock holds), copies get 409 past
// the first expiry, and the effect is once.
func TestRenewal(t *testing.T) {
	for _, b := range []string{"postgres", "mysql"} { // SQLite's write lock keeps the key (no renewal)
		t.Run(b, func(t *testing.T) {
			const lease = 300 * time.Millisecond
			f := open(t, b, newNames(t), true, WithLease(lease))
			order := storetest.UniqueName("o")
			ctx := context.Background()
			url, body, first, unblock := f.blockedFirst(t, order)
			if b == "postgres" {
				// No lease to renew: the handler's transaction holds the
				// key's lock for as long as it runs.
				time.Sleep(2 * lease)
			} else {
				l, err := f.leaser.Acquire(ctx, DefaultName, driver.Claim{ID: ordersID("k-" + order)}, lease)
				if err != nil || l.Result != driver.LeaseBusy {
					t.Fatal(l, err)
				}
				firstUntil := l.Until
				servicetest.WaitFor(t, 10*time.Second, "a renewal past the first expiry", func() bool {
					l, err := f.leaser.Acquire(ctx, DefaultName, driver.Claim{ID: ordersID("k-" + order)}, lease)
					return err == nil && l.Result == driver.LeaseBusy && l.Until.After(firstUntil) && time.Now().After(firstUntil)
				})
			}
			problemOf(t, post(t, url, "k-"+order, body), http.StatusConflict)
			close(unblock)
			if a := <-first; a.status != http.StatusCreated {
				t.Fatalf("first: %d %s", a.status, a.body)
			}
			if got := f.count(order); got != 1 {
				t.Fatalf("%d effects, want 1", got)
			}
		})
	}
}

// blockedFirst serves orders with a handler that waits for unblock to be
// closed, and sends a first request for order, whose answer comes on
// first; it returns once that request's handler runs.
func (f *fixture) blockedFirst(t *testing.T, order string) (url, body string, first chan answer, unblock chan struct{}) {
	entered, unblock := make(chan struct{}), make(chan struct{})
	biz := f.orders()
	url = serve(t, f.handler(func(w http.ResponseWriter, r *http.Request, ex execFunc) error {
		close(entered)
		<-unblock
		return biz(w, r, ex)
	}))
	body = `{"order":"` + order + `"}`
	first = make(chan answer)
	go func() {
		a, err := tryPost(url, "k-"+order, body)
		if err != nil {
			t.Error(err)
		}
		first <- a
	}()
	<-entered
	return url, body, first, unblock
}

// heldLock: on Postgres a transaction holding the key's claim, not yet
// committed, makes a request with the key 409 with Retry-After 1; once it
// ends, the request runs.
func heldLock(t *testing.T, f *fixture) {
	order := storetest.UniqueName("o")
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	holdClaim(t, tx, f, order)
	url := serve(t, f.handler(f.orders()))
	a := post(t, url, "k-"+order, `{"order":"`+order+`"}`)
	problemOf(t, a, http.StatusConflict)
	if a.header.Get("Retry-After") != "1" {
		t.Fatalf("Retry-After %q, want 1", a.header.Get("Retry-After"))
	}
	if got := f.count(order); got != 0 {
		t.Fatalf("%d effects while the key is held, want 0", got)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if a := post(t, url, "k-"+order, `{"order":"`+order+`"}`); a.status != http.StatusCreated {
		t.Fatalf("after the holder ended: %d %s", a.status, a.body)
	}
	if got := f.count(order); got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
}

// deadLockHolder: on Postgres a holder whose connection died (its socket
// closed with its transaction open, the key claimed and an effect
// written) frees the key: a request then runs, and the dead holder's
// effect is not in.
func deadLockHolder(t *testing.T, f *fixture) {
	order := storetest.UniqueName("o")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, servicetest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	holdClaim(t, tx, f, order)
	if _, err := tx.Exec(ctx, f.insert, order); err != nil {
		t.Fatal(err)
	}
	url := serve(t, f.handler(f.orders()))
	problemOf(t, post(t, url, "k-"+order, `{"order":"`+order+`"}`), http.StatusConflict)
	conn.PgConn().Conn().Close() // the holder's process dies: no ROLLBACK, no Terminate
	servicetest.WaitFor(t, 10*time.Second, "the dead holder's claim to end", func() bool {
		a := post(t, url, "k-"+order, `{"order":"`+order+`"}`)
		if a.status != http.StatusConflict && a.status != http.StatusCreated {
			t.Fatalf("%d %s", a.status, a.body)
		}
		return a.status == http.StatusCreated
	})
	if got := f.count(order); got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
}

// holdClaim claims order's key in tx, as a request in progress has, and
// leaves it uncommitted.
func holdClaim(t *testing.T, tx pgx.Tx, f *fixture, order string) {
	t.Helper()
	if _, err := tx.Exec(context.Background(), `INSERT INTO `+f.names.Claims+` (consumer, message_id) VALUES ($1, $2)`,
		DefaultName, ordersID("k-"+order)); err != nil {
		t.Fatal(err)
	}
}
