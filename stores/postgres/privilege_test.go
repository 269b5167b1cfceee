package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/drain"

	"github.com/idemq/idemq/core/driver"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/storetest"
)

// leastPrivilegeGrants are the grants in docs/stores.md (least privilege) for a consumer's role on
// the dedup table; Migrate ran as the owner. Pruning needs UPDATE too.
const leastPrivilegeGrants = "SELECT, INSERT, DELETE"

// TestLeastPrivilege runs Migrate as the owner, then a consumer as a role
// with only the grants in docs/stores.md (least privilege) (no DDL, no schema CREATE): opening with
// migrate=false, claims, duplicates, a fingerprint mismatch and Inspect
// work; Prune works once UPDATE is granted too; Migrate and any DDL are
// refused.
func TestLeastPrivilege(t *testing.T) {
	base := postgresURL(t)
	pool := testPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owner := openStore(t, pool) // Migrate as the owner
	table := owner.Table()
	effects := effectsTable(t, pool)

	role := storetest.UniqueName("idemq_lp_")
	pass := "lp-" + role
	for _, q := range []string{
		fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s' NOSUPERUSER NOCREATEDB NOCREATEROLE`, role, pass),
		fmt.Sprintf(`REVOKE CREATE ON SCHEMA public FROM %s`, role),
		fmt.Sprintf(`GRANT %s ON %s TO %s`, leastPrivilegeGrants, table, role),
		fmt.Sprintf(`GRANT SELECT, INSERT ON %s TO %s`, effects, role),
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		pool.Exec(context.Background(), `DROP OWNED BY `+role)
		pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+role)
	})
	var canCreate bool
	if err := pool.QueryRow(ctx, `SELECT has_schema_privilege($1, 'public', 'CREATE')`, role).Scan(&canCreate); err != nil {
		t.Fatal(err)
	}
	if canCreate {
		t.Skip("PUBLIC may create in schema public on this server (PostgreSQL < 15 defaults): the role would have DDL rights")
	}

	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, pass)
	q := u.Query()
	q.Set("table", table)
	u.RawQuery = q.Encode()

	if _, err := core.OpenStore[pgx.Tx](ctx, u.String()); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("Open with migrate as the role: %v; want permission denied", err)
	}
	q.Set("migrate", "false")
	u.RawQuery = q.Encode()
	st, err := core.OpenStore[pgx.Tx](ctx, u.String())
	if err != nil {
		t.Fatalf("Open with migrate=false as the role: %v", err)
	}
	s := st.(*postgres.Store)
	defer s.Close()
	if _, err := s.Pool().Exec(ctx, `CREATE TABLE `+role+`_x (a int)`); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("DDL as the role: %v; want permission denied", err)
	}
	if err := s.Migrate(ctx); err == nil {
		t.Errorf("Migrate as the role succeeded")
	}

	b, err := memory.NewBroker()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var msgs []*driver.Message
	for i := range 20 {
		msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("lp-%02d", i), Body: []byte("b")})
	}
	msgs = append(msgs, msgs[0], msgs[1], &driver.Message{ID: "lp-02", Body: []byte("other body")})
	if err := b.Publish(ctx, "q", msgs...); err != nil {
		t.Fatal(err)
	}
	handler := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (k) VALUES ($1)`, m.ID)
		return err
	}
	res, err := drain.Drain(ctx, b, "q", func(sub *memory.Subscription) (*core.Consumer[pgx.Tx], error) {
		return core.New[pgx.Tx](sub, s, handler, core.WithName("lp"), core.WithBatchSize(5), core.WithLogger(quiet()))
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Processed != 20 || res.Duplicates != 2 || res.DeadLettered != 1 || res.Retried != 0 {
		t.Fatalf("as the role: %+v; want 20 processed, 2 duplicates, 1 dead letter (fingerprint), no retries", res.Stats)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+effects).Scan(&n); err != nil || n != 20 {
		t.Fatalf("effects %d, %v; want 20", n, err)
	}
	// Prune locks the rows it deletes (FOR UPDATE SKIP LOCKED, so that
	// pruners never wait on each other), and PostgreSQL wants UPDATE for
	// any row lock: the pruning role needs it on top.
	if _, err := s.Prune(ctx, time.Now().Add(time.Hour), 100); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("Prune without UPDATE: %v; want permission denied", err)
	}
	// Without UPDATE the store claimed with the read-back statement: a
	// duplicate claim takes no row lock.
	if lockedByClaim(t, ctx, s, pool, table, "lp-03") {
		t.Error("a role without UPDATE: the duplicate claim locked the row, want the read-back claim")
	}
	// UPDATE on the fingerprint column alone is enough for the
	// one-statement claim, which locks a duplicate's row until the commit
	// and still tells a mismatch.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`GRANT UPDATE (fingerprint) ON %s TO %s`, table, role)); err != nil {
		t.Fatal(err)
	}
	st2, err := core.OpenStore[pgx.Tx](ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	s2 := st2.(*postgres.Store)
	defer s2.Close()
	if !lockedByClaim(t, ctx, s2, pool, table, "lp-04") {
		t.Error("with UPDATE (fingerprint): the duplicate claim took no row lock, want the one-statement claim")
	}
	txn, err := s2.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := txn.Claim(ctx, "lp", []driver.Claim{{ID: "lp-05", Fingerprint: core.Fingerprint([]byte("not the stored body"))}, {ID: "lp-new", Fingerprint: "f"}})
	txn.Rollback(ctx)
	if err != nil || len(got) != 2 || got[0] != driver.ClaimMismatch || got[1] != driver.ClaimWon {
		t.Errorf("one-statement claim as the role: %v, %v; want [mismatch won]", got, err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`GRANT UPDATE ON %s TO %s`, table, role)); err != nil {
		t.Fatal(err)
	}
	pruned, err := s.Prune(ctx, time.Now().Add(time.Hour), 100)
	if err != nil || pruned != 20 {
		t.Errorf("Prune as the role: %d, %v; want 20 rows", pruned, err)
	}
	if _, err := s.Inspect(ctx); err != nil {
		t.Errorf("Inspect as the role: %v", err)
	}
}

// lockedByClaim claims id (already claimed by consumer "lp") in a
// transaction of st left open, and reports whether that took a row lock on
// the stored row (its xmax, read through pool, is the claimer's).
func lockedByClaim(t *testing.T, ctx context.Context, st *postgres.Store, pool *pgxpool.Pool, table, id string) bool {
	t.Helper()
	txn, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Rollback(ctx)
	got, err := txn.Claim(ctx, "lp", []driver.Claim{{ID: id, Fingerprint: core.Fingerprint([]byte("b"))}})
	if err != nil || len(got) != 1 || got[0] != driver.ClaimDuplicate {
		t.Fatalf("claiming %s again: %v, %v; want duplicate", id, got, err)
	}
	var xmax string
	if err := pool.QueryRow(ctx, `SELECT xmax::text FROM `+table+` WHERE consumer = 'lp' AND message_id = $1`, id).Scan(&xmax); err != nil {
		t.Fatal(err)
	}
	return xmax != "0"
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
