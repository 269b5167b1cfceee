package idempotency

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/idemq/idemq/stores/storetest"
)

// principalKey is the request context's key of the account that
// authenticate found.
type principalKey struct{}

// authenticate stands for a service's authentication middleware: it puts
// the caller's account (here read from tenantHeader) in the request's
// context and refuses a request without one.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		acct := r.Header.Get(tenantHeader)
		if acct == "" {
			http.Error(w, "who are you?", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, acct)))
	})
}

// principalScope is the scope of a service whose authentication runs
// before the middleware: the account it found, and the route.
func principalScope(r *http.Request) string {
	acct, _ := r.Context().Value(principalKey{}).(string)
	return acct + " " + r.Method + " " + r.URL.Path
}

// Wrap is middleware a chi router takes with Use, after authentication:
// the handler reaches the transaction from its request's context, each
// account's key is its own, a 5xx the handler answers rolls back and
// frees the key, and a GET passes through without a key.
func TestWrapWithChi(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		order, flaky := storetest.UniqueName("o"), storetest.UniqueName("o")
		var tries atomic.Int32
		r := chi.NewRouter()
		r.Use(authenticate, f.wrap)
		r.Get("/orders/{id}", func(w http.ResponseWriter, r *http.Request) {
			if r.Context().Value(txKey{}) != nil {
				http.Error(w, "a GET ran in a transaction", http.StatusInternalServerError)
				return
			}
			fmt.Fprint(w, chi.URLParam(r, "id"))
		})
		r.Method(http.MethodPost, "/orders", f.wrapped(func(w http.ResponseWriter, r *http.Request, ex execFunc) error {
			var in struct{ Order string }
			if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
				return err
			}
			acct := r.Context().Value(principalKey{}).(string)
			if err := ex(f.insert, acct+"/"+in.Order); err != nil {
				return err
			}
			if in.Order == flaky && tries.Add(1) == 1 {
				http.Error(w, "payment provider unavailable", http.StatusBadGateway)
				return nil
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"account":%q,"order":%q}`, acct, in.Order)
			return nil
		}))
		srv := httptest.NewServer(r)
		t.Cleanup(srv.Close)
		url := srv.URL + "/orders"

		key, body := "k-"+order, `{"order":"`+order+`"}`
		for i, c := range []struct {
			acct     string
			replayed string
		}{{"acme", ""}, {"acme", "true"}, {"globex", ""}, {"globex", "true"}} {
			a, err := tryPostAs(url, c.acct, key, body)
			if err != nil {
				t.Fatal(err)
			}
			if a.status != http.StatusCreated || !strings.Contains(a.body, `"`+c.acct+`"`) || a.header.Get("Idempotent-Replayed") != c.replayed {
				t.Fatalf("request %d of %s: %d %v %s", i+1, c.acct, a.status, a.header, a.body)
			}
		}
		for _, acct := range []string{"acme", "globex"} {
			if got := f.count(acct + "/" + order); got != 1 {
				t.Fatalf("%s: %d effects, want 1", acct, got)
			}
		}

		// The handler's 502: its effect rolled back, nothing stored, its
		// own answer sent; the retry runs the handler again.
		a, err := tryPostAs(url, "acme", "k-"+flaky, `{"order":"`+flaky+`"}`)
		if err != nil {
			t.Fatal(err)
		}
		if a.status != http.StatusBadGateway || !strings.Contains(a.body, "payment provider unavailable") || a.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("failing handler: %d %v %s", a.status, a.header, a.body)
		}
		if got := f.count("acme/" + flaky); got != 0 {
			t.Fatalf("%d effects of a handler that answered 502, want 0", got)
		}
		if a, err := tryPostAs(url, "acme", "k-"+flaky, `{"order":"`+flaky+`"}`); err != nil || a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry after the 502: %d %v %s %v", a.status, a.header, a.body, err)
		}
		if got := f.count("acme/" + flaky); got != 1 {
			t.Fatalf("%d effects after the retry, want 1", got)
		}

		a, err = tryPostAs(url, "acme", "", body)
		if err != nil {
			t.Fatal(err)
		}
		problemOf(t, a, http.StatusBadRequest)

		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/orders/"+order, nil)
		req.Header.Set(tenantHeader, "acme")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || string(got) != order {
			t.Fatalf("GET without a key: %d %s", res.StatusCode, got)
		}
	}, WithScope(principalScope))
}
