package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/sqlite"
)

// TestOpenStoreByURL opens the store through core.OpenStore, as the
// quickstart's --store flag does.
func TestOpenStoreByURL(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "u.db")
	st, err := core.OpenStore[*sql.Tx](ctx, "sqlite://"+path+"?table=inbox&retention=3h&busy_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	s := st.(*sqlite.Store)
	defer s.Close()
	if s.Table() != "inbox" || s.Retention().Hours() != 3 {
		t.Fatalf("URL options not applied: table %q retention %v", s.Table(), s.Retention())
	}
	txn, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "a"}})
	if err != nil || res[0] != driver.ClaimWon {
		t.Fatalf("claim: %v %v", res, err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		"sqlite://" + path + "?table=a-b",
		"sqlite://" + path + "?retention=soon",
		"sqlite://" + path + "?nope=1",
		"sqlite://",
	} {
		if _, err := core.OpenStore[*sql.Tx](ctx, bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
