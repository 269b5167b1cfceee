package idempotency

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idemq/idemq/stores/storetest"
)

// tenantHeader names the tenant of a test request: it stands for what a
// service's authentication would find.
const tenantHeader = "X-Tenant"

// Two tenants sending the same key and body each get their own response
// and their own effect, and each tenant's retry replays its own response:
// the scope holds the authenticated principal.
func TestTenantsKeepTheirOwnKeys(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		order := storetest.UniqueName("o")
		url := serve(t, f.handler(func(w http.ResponseWriter, r *http.Request, ex execFunc) error {
			tenant := r.Header.Get(tenantHeader)
			if err := ex(f.insert, tenant+"/"+order); err != nil {
				return err
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"tenant":%q}`, tenant)
			return nil
		}))
		key, body := "k-"+order, `{"order":"`+order+`"}`
		for _, tenant := range []string{"acme", "globex", "acme", "globex"} {
			a, err := tryPostAs(url, tenant, key, body)
			if err != nil {
				t.Fatal(err)
			}
			if a.status != http.StatusCreated || !strings.Contains(a.body, `"`+tenant+`"`) {
				t.Fatalf("tenant %s got %d %v %s", tenant, a.status, a.header, a.body)
			}
		}
		for _, tenant := range []string{"acme", "globex"} {
			if got := f.count(tenant + "/" + order); got != 1 {
				t.Fatalf("tenant %s: %d effects, want 1", tenant, got)
			}
		}
	})
}

// The scope is the service's to say: New without WithScope fails naming
// it, on every store.
func TestScopeIsRequired(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		_, err := f.newWith()
		if err == nil || !strings.Contains(err.Error(), "option WithScope: required") {
			t.Fatalf("New without WithScope: %v", err)
		}
	})
}
