package mysql_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/mysql"
	"github.com/idemq/idemq/stores/storetest"
)

// TestOpenStoreByURL opens the store through core.OpenStore, as the
// quickstart's --store flag does.
func TestOpenStoreByURL(t *testing.T) {
	cfg, err := mysql.ParseDSN(mysqlDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	table := storetest.UniqueName("idemq_url_")
	base := storeURL(t)
	st, err := core.OpenStore[*sql.Tx](ctx, base+"&table="+table+"&retention=3h&isolation=read-committed")
	if err != nil {
		t.Fatal(err)
	}
	s := st.(*mysql.Store)
	defer s.Close()
	defer s.DB().Exec(`DROP TABLE IF EXISTS ` + table + `, ` + table + `_leases`)
	if s.Table() != table || s.Retention().Hours() != 3 {
		t.Fatalf("URL options not applied: table %q retention %v", s.Table(), s.Retention())
	}
	txn, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Rollback(ctx)
	if res, err := txn.Claim(ctx, "c", []driver.Claim{{ID: "a"}}); err != nil || res[0] != driver.ClaimWon {
		t.Fatalf("claim: %v %v", res, err)
	}
	// READ COMMITTED shows a row committed by another session after this
	// transaction's first read; REPEATABLE READ would not.
	count := func() int {
		var n int
		if err := txn.Tx().QueryRow(`SELECT count(*) FROM ` + table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := count()
	if _, err := s.DB().Exec(`INSERT INTO `+table+` (consumer, message_id, processed_at) VALUES ('other', 'x', ?)`, "2026-01-01 00:00:00"); err != nil {
		t.Fatal(err)
	}
	if after := count(); after != before+1 {
		t.Fatalf("isolation from the URL not applied: a committed row stayed invisible (%d then %d)", before, after)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{base + "&table=a;b", base + "&retention=soon", base + "&isolation=dirty"} {
		if _, err := core.OpenStore[*sql.Tx](ctx, bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	// A typo is refused at start-up, named (it was a SQL syntax error
	// naming nothing); a system variable passes when written as such.
	_, err = core.OpenStore[*sql.Tx](ctx, base+"&isolaton=read-committed")
	if err == nil || !strings.Contains(err.Error(), `unknown parameter "isolaton" (did you mean isolation?)`) {
		t.Errorf("isolaton=read-committed: %v, want it refused, named, with a suggestion", err)
	}
	st2, err := core.OpenStore[*sql.Tx](ctx, base+"&table="+table+"&mysql.time_zone=%27%2B07:00%27")
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	var tz string
	if err := st2.(*mysql.Store).DB().QueryRow(`SELECT @@session.time_zone`).Scan(&tz); err != nil || tz != "+07:00" {
		t.Errorf("mysql.time_zone not passed as time_zone: %q %v", tz, err)
	}
	// The driver's own DSN form gets the URL to write.
	_, err = core.OpenStore[*sql.Tx](ctx, cfg.User+":"+cfg.Passwd+"@tcp("+cfg.Addr+")/"+cfg.DBName)
	if err == nil || !strings.Contains(err.Error(), "write mysql://"+cfg.User+":PASSWORD@"+cfg.Addr+"/"+cfg.DBName) {
		t.Errorf("a go-sql-driver DSN: %v, want the URL to write", err)
	}
}
