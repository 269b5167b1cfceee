package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/mysql"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/sqlite"
)

// claimAll commits claims for consumer through the store and fails unless
// every one is won.
func claimAll[Tx any](t *testing.T, s driver.Store[Tx], consumer string, claims []driver.Claim) {
	t.Helper()
	ctx := context.Background()
	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Rollback(ctx)
	res, err := txn.Claim(ctx, consumer, claims)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r != driver.ClaimWon {
			t.Fatalf("seed claim of %s: %v", claims[i].ID, r)
		}
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkLookupForget runs lookup and forget on the store at storeURL, whose
// table it fills through the store's own package (a store from open), and
// checks that the output never shows secret.
func checkLookupForget[Tx any](t *testing.T, storeURL, secret string, open func() driver.Store[Tx]) {
	t.Helper()
	seed := func(consumer string, claims []driver.Claim) {
		s := open()
		defer s.Close()
		claimAll(t, s, consumer, claims)
	}
	at := time.Now().UTC()
	fp := core.Fingerprint([]byte("the body"))
	seed("billing", []driver.Claim{{ID: "m-1", Fingerprint: fp}, {ID: "m-2"}, {ID: "-dash"}})
	seed("audit", []driver.Claim{{ID: "m-1"}})
	var outputs []result
	keep := func(r result) result { outputs = append(outputs, r); return r }

	r := keep(expect(t, exitOK, []string{"lookup", "--store", storeURL, "--consumer", "billing", "m-1", "m-3", "m-2", "--", "-dash"},
		"3 of 4 ids claimed", "ID", "CLAIMED", "FINGERPRINT"))
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 6 {
		t.Fatalf("lookup: want a header, a title and 4 rows\n%s", r)
	}
	day := at.Format("2006-01-02T")
	for i, want := range [][]string{{"m-1", "yes", day, fp}, {"m-3", "no", "-"}, {"m-2", "yes", day, "(none)"}, {"-dash", "yes", day}} {
		f := strings.Fields(lines[2+i])
		if len(f) < len(want) {
			t.Fatalf("lookup row %d %q, want %q", i, lines[2+i], want)
		}
		for j, w := range want {
			if !strings.HasPrefix(f[j], w) {
				t.Fatalf("lookup row %d %q, want %q", i, lines[2+i], want)
			}
		}
	}

	// --json, flags after the ids.
	r = keep(expect(t, exitOK, []string{"lookup", "--store", storeURL, "m-1", "m-3", "--consumer", "billing", "--json"}))
	infos := lookupJSON(t, r)
	if len(infos) != 2 || infos[0].ID != "m-1" || !infos[0].Claimed || infos[0].Fingerprint != fp ||
		infos[1].ID != "m-3" || infos[1].Claimed || infos[1].At != "" || infos[1].Fingerprint != "" {
		t.Fatalf("lookup --json: %+v", infos)
	}
	when, err := time.Parse(time.RFC3339Nano, infos[0].At)
	if err != nil || when.Sub(at).Abs() > time.Minute {
		t.Fatalf("lookup --json: m-1 claimed at %q (%v), want about %v", infos[0].At, err, at)
	}

	// A message in progress shows its lease.
	s := open()
	lease, err := s.(driver.Leaser).Acquire(context.Background(), "billing", driver.Claim{ID: "m-4"}, time.Hour)
	s.Close()
	if err != nil || lease.Result != driver.LeaseWon {
		t.Fatalf("acquire m-4: %+v, %v", lease, err)
	}
	token := fmt.Sprintf("token %d", lease.Token)
	r = keep(expect(t, exitOK, []string{"lookup", "--store", storeURL, "--consumer", "billing", "m-4", "m-2"},
		"1 of 2 ids claimed, 1 in progress", "LEASE", "in progress until "+lease.Until.UTC().Format(time.RFC3339)+", "+token))
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 4 || !strings.HasSuffix(lines[2], token) || !strings.HasSuffix(lines[3], " -") {
		t.Fatalf("lookup of a lease: want the lease on m-4's row only\n%s", r)
	}
	r = keep(expect(t, exitOK, []string{"lookup", "--store", storeURL, "--consumer", "billing", "--json", "m-4", "m-2"}))
	leases := lookupJSON(t, r)
	if len(leases) != 2 || leases[0].Claimed || leases[0].LeaseToken != lease.Token || leases[1].LeaseUntil != "" || leases[1].LeaseToken != 0 {
		t.Fatalf("lookup --json of a lease: %+v", leases)
	}
	if until, err := time.Parse(time.RFC3339Nano, leases[0].LeaseUntil); err != nil || until.Sub(lease.Until).Abs() > time.Millisecond {
		t.Fatalf("lookup --json: lease until %q (%v), want %v", leases[0].LeaseUntil, err, lease.Until)
	}

	// stats shows each consumer's claims in progress, the expired ones
	// too, and a consumer that has leases but no claims yet.
	s = open()
	mail, err := s.(driver.Leaser).Acquire(context.Background(), "mailer", driver.Claim{ID: "mail-1"}, time.Millisecond)
	s.Close()
	if err != nil || mail.Result != driver.LeaseWon {
		t.Fatalf("acquire mail-1: %+v, %v", mail, err)
	}
	time.Sleep(50 * time.Millisecond) // mail-1's lease runs out
	r = keep(expect(t, exitOK, []string{"stats", "--store", storeURL}, "IN PROGRESS"))
	rows := map[string]string{}
	for _, line := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = strings.Join(f, " ")
		}
	}
	for consumer, want := range map[string]string{"billing": " 1 (0 expired)", "audit": " 0 (0 expired)", "mailer": "mailer 0 - - - 1 (1 expired)"} {
		if !strings.HasSuffix(rows[consumer], want) {
			t.Errorf("stats: the row of %s does not end in %q\n%s", consumer, want, r)
		}
	}
	r = keep(expect(t, exitOK, []string{"stats", "--store", storeURL, "--json"}))
	var st admin.TableStats
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, r)
	}
	got := map[string][2]int64{}
	for _, c := range st.Consumers {
		got[c.Consumer] = [2]int64{c.Leases, c.ExpiredLeases}
	}
	if want := map[string][2]int64{"audit": {0, 0}, "billing": {1, 0}, "mailer": {1, 1}}; !maps.Equal(got, want) {
		t.Errorf("stats --json: leases (held, expired) by consumer %v, want %v", got, want)
	}

	// Without --yes: a usage error saying what it would do, and nothing
	// deleted.
	r = keep(expect(t, exitUsage, []string{"forget", "--store", storeURL, "--consumer", "billing", "m-1", "m-3"},
		"would delete the claims of consumer billing for 2 ids (m-1, m-3)", "--yes"))
	if r.stdout != "" {
		t.Errorf("refused forget wrote to stdout: %q", r.stdout)
	}
	keep(expect(t, exitOK, []string{"lookup", "--store", storeURL, "--consumer", "billing", "m-1"}, "1 of 1 ids claimed"))

	r = keep(expect(t, exitOK, []string{"forget", "--store", storeURL, "--consumer", "billing", "--yes", "m-1", "m-3", "--", "-dash"},
		"m-1: forgot the claim of "+day, "m-3: was not claimed", "-dash: forgot the claim", "forgot 2 claims of consumer billing"))
	r = keep(expect(t, exitOK, []string{"lookup", "--store", storeURL, "--consumer", "billing", "--json", "m-1", "m-2", "--", "-dash"}))
	infos = lookupJSON(t, r)
	if len(infos) != 3 || infos[0].Claimed || !infos[1].Claimed || infos[2].Claimed {
		t.Fatalf("lookup after forget: %+v", infos)
	}
	// Another consumer's claim of the same id stays.
	keep(expect(t, exitOK, []string{"lookup", "--store", storeURL, "--consumer", "audit", "m-1"}, "1 of 1 ids claimed"))
	// A forgotten id is claimed again.
	seed("billing", []driver.Claim{{ID: "m-1"}})

	for _, c := range [][]string{
		{"lookup", "--store", storeURL, "m-1"},
		{"lookup", "--store", storeURL, "--consumer", "billing"},
		{"forget", "--store", storeURL, "--consumer", "", "--yes", "m-1"},
	} {
		r := keep(expect(t, exitUsage, c))
		if !strings.Contains(r.stderr, "--consumer is required") && !strings.Contains(r.stderr, "at least one message id") {
			t.Errorf("idemq %s: %s", strings.Join(c, " "), r)
		}
	}
	for _, r := range outputs {
		if secret != "" && strings.Contains(r.stdout+r.stderr, secret) {
			t.Errorf("output shows the password:\n%s", r)
		}
	}
}

// lookupJSON reads the output of lookup --json.
func lookupJSON(t *testing.T, r result) []claimJSON {
	t.Helper()
	var infos []claimJSON
	if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil {
		t.Fatalf("lookup --json: %v\n%s", err, r)
	}
	return infos
}

func TestLookupForgetSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lf.db")
	checkLookupForget(t, "sqlite://"+path+"?table=claims", "", func() driver.Store[*sql.Tx] {
		s, err := sqlite.Open(context.Background(), path, sqlite.WithTable("claims"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestLookupForgetPostgres(t *testing.T) {
	base := postgresURL(t)
	const secret = "Sup3rS3cretPW"
	for _, partitioned := range []bool{false, true} {
		name := "plain"
		if partitioned {
			name = "partitioned"
		}
		t.Run(name, func(t *testing.T) {
			table := "idemq_cli_lf_" + randomHex(4)
			sep := "?"
			if strings.Contains(base, "?") {
				sep = "&"
			}
			ctx := context.Background()
			opts := []postgres.Option{postgres.WithTable(table)}
			storeURL := withSecret(base, secret) + sep + "table=" + table
			if partitioned {
				opts = append(opts, postgres.WithPartitions(24*time.Hour))
				storeURL += "&partitions=24h"
			}
			t.Cleanup(func() {
				if conn, err := pgx.Connect(ctx, base); err == nil {
					conn.Exec(ctx, `DROP TABLE IF EXISTS `+table+`, `+table+`_leases CASCADE`)
					conn.Close(ctx)
				}
			})
			checkLookupForget(t, storeURL, secret, func() driver.Store[pgx.Tx] {
				s, err := postgres.Open(ctx, base, opts...)
				if err != nil {
					t.Fatal(err)
				}
				return s
			})
		})
	}
}

func TestLookupForgetMySQL(t *testing.T) {
	dsn := servicetest.MySQLURL(t)
	cfg, err := servicetest.ParseMySQL(dsn)
	if err != nil {
		t.Fatal(err)
	}
	table := "idemq_cli_lf_" + randomHex(4)
	ctx := context.Background()
	t.Cleanup(func() {
		if db, err := sql.Open("mysql", cfg.FormatDSN()); err == nil {
			db.Exec(`DROP TABLE IF EXISTS ` + table + `, ` + table + `_leases`)
			db.Close()
		}
	})
	user := url.User(cfg.User)
	if cfg.Passwd != "" {
		user = url.UserPassword(cfg.User, cfg.Passwd)
	}
	u := url.URL{Scheme: "mysql", User: user, Host: cfg.Addr, Path: "/" + cfg.DBName, RawQuery: "table=" + table}
	// The server's password, if any, must not show either.
	checkLookupForget(t, u.String(), cfg.Passwd, func() driver.Store[*sql.Tx] {
		s, err := mysql.Open(ctx, cfg.FormatDSN(), mysql.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
