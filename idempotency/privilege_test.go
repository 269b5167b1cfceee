package idempotency

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/storetest"
	"github.com/jackc/pgx/v5"
)

// On Postgres a role granted SELECT, INSERT and DELETE on the claims
// table (no UPDATE) gets its keys decided: the first request runs, its
// retry is replayed, and the effect is in once.
func TestLeastPrivilegePostgres(t *testing.T) {
	ctx := context.Background()
	n := newNames(t)
	owner := open(t, "postgres", n, true)
	role := storetest.UniqueName("idemq_hlp_")
	pass := "lp-" + role
	for _, q := range []string{
		fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s' NOSUPERUSER NOCREATEDB NOCREATEROLE`, role, pass),
		fmt.Sprintf(`GRANT SELECT, INSERT, DELETE ON %s TO %s`, n.Claims, role),
		fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE ON %s TO %s`, n.Responses, role),
		fmt.Sprintf(`GRANT SELECT, INSERT ON %s TO %s`, n.Effects, role),
	} {
		if _, err := owner.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		owner.pool.Exec(context.Background(), `DROP OWNED BY `+role)
		owner.pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+role)
	})
	u, err := url.Parse(servicetest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, pass)
	s, err := postgres.Open(ctx, u.String(), postgres.WithTable(n.Claims), postgres.WithMigrate(false))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, err := New(s, WithTable(n.Responses), WithScope(testScope))
	if err != nil {
		t.Fatal(err)
	}
	order := storetest.UniqueName("o")
	url := serve(t, m.Handler(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if _, err := tx.Exec(r.Context(), owner.insert, order); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}))
	body := `{"order":"` + order + `"}`
	if a := post(t, url, "k-"+order, body); a.status != http.StatusCreated {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	if a := post(t, url, "k-"+order, body); a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %v %s", a.status, a.header, a.body)
	}
	if got := owner.count(order); got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
}
