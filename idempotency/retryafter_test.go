package idempotency

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/storetest"
)

// A copy of a request that takes a second, sent while that request runs,
// is told to come back within a few seconds, not when the key's lease
// would run out (30 s): the bound is the behaviour, with a wide margin.
func TestRetryAfterWhileRunning(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		order := storetest.UniqueName("o")
		entered := make(chan struct{})
		var once sync.Once
		biz := f.orders()
		url := serve(t, f.handler(func(w http.ResponseWriter, r *http.Request, ex execFunc) error {
			once.Do(func() { close(entered) })
			time.Sleep(time.Second) // a request that takes a second
			return biz(w, r, ex)
		}))
		body := `{"order":"` + order + `"}`
		first := make(chan answer, 1)
		go func() {
			a, err := tryPost(url, "k-"+order, body)
			if err != nil {
				t.Error(err)
			}
			first <- a
		}()
		<-entered
		busy := 0
		for range 3 {
			a := post(t, url, "k-"+order, body)
			switch a.status {
			case http.StatusConflict:
				busy++
				s, err := strconv.Atoi(a.header.Get("Retry-After"))
				if err != nil || s < 1 || s > 3 {
					t.Fatalf("a copy of a request in progress got Retry-After %q, want 1 to 3 seconds", a.header.Get("Retry-After"))
				}
			case http.StatusCreated: // on SQLite a copy waits for the writer, then is replayed
			default:
				t.Fatalf("copy: %d %s", a.status, a.body)
			}
		}
		if a := <-first; a.status != http.StatusCreated {
			t.Fatalf("first: %d %s", a.status, a.body)
		}
		if got := f.count(order); got != 1 {
			t.Fatalf("%d effects, want 1", got)
		}
		t.Logf("%d of 3 copies answered 409", busy)
	})
}

// On the stores that hold keys by leases, a copy meeting a lease of the
// middleware's length that its holder keeps renewing (here, one just
// taken) is told 1 s; one meeting a lease that missed its renewals (its
// holder crashed or hung) is told when that lease runs out, since the key
// is not free before.
func TestRetryAfterOfALease(t *testing.T) {
	for _, b := range []string{"mysql", "sqlite"} {
		t.Run(b, func(t *testing.T) {
			f := open(t, b, newNames(t), true)
			url := serve(t, f.handler(f.orders()))
			ctx := context.Background()
			for _, c := range []struct {
				name     string
				ttl      time.Duration
				min, max int
			}{
				{"renewed", DefaultLease, 1, 1},
				{"missed its renewals", DefaultLease / 3, int(DefaultLease/3/time.Second) - 3, int(DefaultLease / 3 / time.Second)},
			} {
				order := storetest.UniqueName("o")
				l, err := f.leaser.Acquire(ctx, DefaultName, driver.Claim{ID: ordersID("k-" + order)}, c.ttl)
				if err != nil || l.Result != driver.LeaseWon {
					t.Fatal(l, err)
				}
				a := post(t, url, "k-"+order, `{"order":"`+order+`"}`)
				problemOf(t, a, http.StatusConflict)
				if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < c.min || s > c.max {
					t.Errorf("a lease that %s: Retry-After %q, want %d to %d", c.name, a.header.Get("Retry-After"), c.min, c.max)
				}
				if got := f.count(order); got != 0 {
					t.Fatalf("%d effects while the key is held, want 0", got)
				}
			}
		})
	}
}
