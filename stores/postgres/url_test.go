package postgres_test

import (
	"context"
	"database/sql"
	"net/url"
	"strings"
	"testing"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/storetest"
	"github.com/jackc/pgx/v5"
)

// TestOpenStoreByURL opens the store through core.OpenStore, as the
// quickstart's --store flag does, with the store's own parameters mixed
// with pgx's.
func TestOpenStoreByURL(t *testing.T) {
	base := postgresURL(t)
	ctx := context.Background()
	table := storetest.UniqueName("idemq_url_")
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	url := base + sep + "table=" + table + "&retention=2h&application_name=idemq_test"
	st, err := core.OpenStore[pgx.Tx](ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.(interface{ Close() error }).Close()
	pool := testPool(t)
	defer pool.Exec(ctx, `DROP TABLE IF EXISTS `+table+`, `+table+`_leases`)
	if r, ok := st.(driver.Retentioner); !ok || r.Retention().Hours() != 2 {
		t.Fatalf("retention from the URL not applied: %v", st)
	}
	txn, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Rollback(ctx)
	if res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "a"}}); err != nil || res[0] != driver.ClaimWon {
		t.Fatalf("claim: %v %v", res, err)
	}
	var app string
	if err := txn.Tx().QueryRow(ctx, `SELECT current_setting('application_name')`).Scan(&app); err != nil || app != "idemq_test" {
		t.Fatalf("pgx parameter not passed on: %q %v", app, err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n != 1 {
		t.Fatalf("claims in %s: %d, %v", table, n, err)
	}

	for _, bad := range []string{
		base + sep + "table=a-b",
		base + sep + "retention=soon",
		base + sep + "partitions=90s",
		base + sep + "table=a;b",
	} {
		if _, err := core.OpenStore[pgx.Tx](ctx, bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	// A handler type that does not match is refused before any use.
	if _, err := core.OpenStore[*sql.Tx](ctx, url); err == nil {
		t.Error("postgres store opened for *sql.Tx handlers")
	}
	// A typo is refused at start-up, named, never sent to the server; a
	// server parameter passes when written as such.
	_, err = core.OpenStore[pgx.Tx](ctx, base+sep+"retension=24h")
	if err == nil || !strings.Contains(err.Error(), `unknown parameter "retension" (did you mean retention?)`) || strings.Contains(err.Error(), "unrecognized configuration") {
		t.Errorf("retension=24h: %v, want it refused, named, with a suggestion", err)
	}
	st2, err := core.OpenStore[pgx.Tx](ctx, base+sep+"table="+table+"&pgx.timezone=Asia/Jakarta")
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	txn2, err := st2.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txn2.Rollback(ctx)
	var tz string
	if err := txn2.Tx().QueryRow(ctx, `SELECT current_setting('TimeZone')`).Scan(&tz); err != nil || tz != "Asia/Jakarta" {
		t.Errorf("pgx.timezone not passed as timezone: %q %v", tz, err)
	}
}

// A host list through core.OpenStore, with an IPv6 literal and a host
// without a port before the last (forms net/url alone refuses): pgx tries
// each in turn and the store works on the one that takes writes.
func TestOpenStoreByHostList(t *testing.T) {
	base, err := url.Parse(postgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	port := base.Port()
	if port == "" {
		port = "5432"
	}
	// Nothing listens on port 1; pgx moves on to the next host.
	list := "[::1]:1,127.0.0.1:1," + base.Hostname() + ":" + port
	raw := strings.Replace(base.String(), base.Host, list, 1)
	sep := "?"
	if strings.Contains(raw, "?") {
		sep = "&"
	}
	table := storetest.UniqueName("idemq_hosts_")
	st, err := core.OpenStore[pgx.Tx](context.Background(), raw+sep+"target_session_attrs=read-write&connect_timeout=5&table="+table)
	if err != nil {
		t.Fatalf("OpenStore with host list %s: %v", list, err)
	}
	defer st.(interface{ Close() error }).Close()
	defer st.(*postgres.Store).Pool().Exec(context.Background(), `DROP TABLE IF EXISTS `+table+`, `+table+`_leases`)
	if err := st.(driver.Pinger).Ping(context.Background()); err != nil {
		t.Fatalf("Ping through the host list: %v", err)
	}
}
