package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/mysqloutbox"
	"github.com/idemq/idemq/outbox/pgoutbox"
	"github.com/idemq/idemq/outbox/sqliteoutbox"
)

// seedParked writes three rows to store through write and parks two with
// a relay whose broker rejects them: P1 (key k1, with B held behind it)
// and P2 (no key). It returns P1's and P2's row numbers.
func seedParked(t *testing.T, store outbox.Store, write func(ctx context.Context, msgs ...*outbox.Message) error) (int64, int64) {
	t.Helper()
	ctx := context.Background()
	err := write(ctx,
		&outbox.Message{ID: "P1", Key: "k1", Destination: "orders", Body: []byte("poison")},
		&outbox.Message{ID: "B", Key: "k1", Destination: "orders", Body: []byte("b")},
		&outbox.Message{ID: "P2", Destination: "emails", Body: []byte("poison!")})
	if err != nil {
		t.Fatal(err)
	}
	pub := outbox.PublisherFunc(func(_ context.Context, dest string, msgs ...*driver.Message) error {
		for _, m := range msgs {
			if strings.HasPrefix(string(m.Body), "poison") {
				return fmt.Errorf("%s: message too large", dest)
			}
		}
		return nil
	})
	r, err := outbox.NewRelay(store, pub, outbox.WithMaxAttempts(1), outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err == nil || r.Stats().Parked != 2 {
		t.Fatalf("seeding: %v, stats %+v; want P1 and P2 parked", err, r.Stats())
	}
	parked, err := store.(outbox.Operator).Parked(ctx, outbox.ParkedFilter{})
	if err != nil || len(parked) != 2 || parked[0].ID != "P1" || parked[1].ID != "P2" {
		t.Fatalf("seeding: parked %+v, %v", parked, err)
	}
	return parked[0].Seq, parked[1].Seq
}

// checkOutboxCommands runs idemq outbox on the table at storeURL, which
// seedParked filled, and checks that the output never shows secret.
func checkOutboxCommands(t *testing.T, storeURL, secret string, p1, p2 int64) {
	t.Helper()
	var outputs []result
	keep := func(r result) result { outputs = append(outputs, r); return r }
	list := func(args ...string) []parkedRowJSON {
		t.Helper()
		r := keep(expect(t, exitOK, append([]string{"outbox", "list", "--store", storeURL, "--json"}, args...)))
		var rows []parkedRowJSON
		if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
			t.Fatalf("list --json: %v\n%s", err, r)
		}
		return rows
	}
	stats := func() statsJSON {
		t.Helper()
		r := keep(expect(t, exitOK, []string{"outbox", "stats", "--store", storeURL, "--json"}))
		var st statsJSON
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			t.Fatalf("stats --json: %v\n%s", err, r)
		}
		return st
	}

	r := keep(expect(t, exitOK, []string{"outbox", "list", "--store", storeURL},
		"2 parked rows shown", "ROW", "CAUSE", "orders: message too large", "emails: message too large"))
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[2], fmt.Sprint(p1)) || !strings.Contains(lines[2], "P1") || !strings.Contains(lines[2], "k1") ||
		!strings.HasPrefix(lines[3], fmt.Sprint(p2)) || !strings.Contains(lines[3], " - ") {
		t.Fatalf("list: want a title, a header and P1 and P2\n%s", r)
	}
	rows := list()
	if len(rows) != 2 || rows[0].Row != p1 || rows[0].ID != "P1" || rows[0].Key != "k1" || rows[0].Destination != "orders" ||
		rows[0].Attempts != 1 || rows[0].BodyBytes != 6 || rows[0].Cause == "" || rows[0].ParkedAt == "" || rows[1].BodyBytes != 7 {
		t.Fatalf("list --json: %+v", rows)
	}
	if rows := list("--key", "k1"); len(rows) != 1 || rows[0].ID != "P1" {
		t.Fatalf("list --key k1: %+v", rows)
	}
	if rows := list("--cause", "emails:"); len(rows) != 1 || rows[0].ID != "P2" {
		t.Fatalf("list --cause emails: %+v", rows)
	}
	if rows := list("--id", fmt.Sprint(p2)); len(rows) != 1 || rows[0].ID != "P2" {
		t.Fatalf("list --id: %+v", rows)
	}
	if rows := list("--cause", "no such cause"); len(rows) != 0 {
		t.Fatalf("list --cause with no match: %+v", rows)
	}
	// Both rows were parked before this list ran, and within the hour.
	for _, c := range []struct {
		args []string
		want int
	}{{[]string{"--older-than", "1h"}, 0}, {[]string{"--older-than", "1ms"}, 2}, {[]string{"--newer-than", "1h"}, 2},
		{[]string{"--newer-than", "1ms"}, 0}, {[]string{"--older-than", "1ms", "--newer-than", "1h", "--key", "k1"}, 1}} {
		if rows := list(c.args...); len(rows) != c.want {
			t.Fatalf("list %v: %d rows, want %d: %+v", c.args, len(rows), c.want, rows)
		}
	}
	keep(expect(t, exitUsage, []string{"outbox", "list", "--store", storeURL, "--older-than", "-1h"}, "must be positive"))
	keep(expect(t, exitOK, []string{"outbox", "stats", "--store", storeURL}, "pending", "parked", "keys held back  1 (1 pending rows"))
	if st := stats(); st.Pending != 1 || st.Parked != 2 || st.HeldKeys != 1 || st.HeldRows != 1 || st.OldestPendingSeconds <= 0 {
		t.Fatalf("stats --json: %+v", st)
	}

	// Usage errors, and --dry-run, change nothing.
	for _, c := range [][]string{
		{"outbox", "redrive", "--store", storeURL},
		{"outbox", "redrive", "--store", storeURL, "--all", "--id", "1"},
		{"outbox", "redrive", "--store", storeURL, "--id", "x"},
		{"outbox", "purge", "--store", storeURL, "--all"},
		{"outbox", "purge", "--store", storeURL, "--id", fmt.Sprint(p1)},
		{"outbox", "purge", "--store", storeURL, "--yes"},
		{"outbox", "list"},
		{"outbox", "frobnicate", "--store", storeURL},
	} {
		keep(expect(t, exitUsage, c))
	}
	keep(expect(t, exitUsage, []string{"outbox", "purge", "--store", storeURL, "--id", fmt.Sprint(p1)}, "pass --yes"))
	keep(expect(t, exitOK, []string{"outbox", "redrive", "--store", storeURL, "--id", fmt.Sprint(p1), "--dry-run"},
		fmt.Sprintf("would redrive 1 of parked rows %d", p1), "nothing changed"))
	keep(expect(t, exitOK, []string{"outbox", "redrive", "--store", storeURL, "--all", "--dry-run"}, "would redrive 2 of all parked rows"))
	if rows := list(); len(rows) != 2 {
		t.Fatalf("after refusals and a dry run: %+v", rows)
	}

	keep(expect(t, exitOK, []string{"outbox", "redrive", "--store", storeURL, fmt.Sprint(p1)}, "redrove 1 of parked rows"))
	if rows := list(); len(rows) != 1 || rows[0].ID != "P2" {
		t.Fatalf("after redriving P1: %+v", rows)
	}
	if st := stats(); st.Pending != 2 || st.Parked != 1 || st.HeldKeys != 0 {
		t.Fatalf("stats after redriving P1: %+v", st)
	}
	keep(expect(t, exitOK, []string{"outbox", "purge", "--store", storeURL, "--all", "--key", "k1", "--yes"}, "purged 0 of all parked rows of key"))
	keep(expect(t, exitOK, []string{"outbox", "purge", "--store", storeURL, "--all", "--older-than", "1h", "--yes"}, "purged 0 of all parked rows parked before"))
	keep(expect(t, exitOK, []string{"outbox", "purge", "--store", storeURL, "--all", "--yes"}, "purged 1 of all parked rows"))
	if st := stats(); st.Pending != 2 || st.Parked != 0 {
		t.Fatalf("stats after the purge: %+v", st)
	}
	for _, sub := range []string{"list", "redrive", "purge", "stats"} {
		keep(expect(t, exitOK, []string{"outbox", sub, "--help"}, "Usage: idemq outbox "+sub))
	}
	for _, r := range outputs {
		if secret != "" && strings.Contains(r.stdout+r.stderr, secret) {
			t.Errorf("output shows the password:\n%s", r)
		}
	}
}

func TestOutboxUsage(t *testing.T) {
	expect(t, exitOK, []string{"outbox", "--help"}, "Usage: idemq outbox <list|redrive|purge|stats>")
	expect(t, exitUsage, []string{"outbox"}, "give a subcommand")
	expect(t, exitUsage, []string{"outbox", "stats", "--store", "redis://h/0"}, "postgres://, mysql:// or sqlite://")
	expect(t, exitUsage, []string{"outbox", "stats", "--store", "sqlite://x.db?table=a", "--table", "b"}, "differ")
	r := expect(t, exitFailure, []string{"outbox", "stats", "--store", "sqlite://" + filepath.Join(t.TempDir(), "missing.db")})
	if !strings.Contains(r.stderr, "no such file") {
		t.Fatalf("a missing SQLite file: %s", r)
	}
}

func TestOutboxSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	o, err := sqliteoutbox.New(sqliteoutbox.WithTable("events_outbox"))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	p1, p2 := seedParked(t, o.Store(db), sqlWrite(db, o.Write))
	checkOutboxCommands(t, "sqlite://"+path+"?table=events_outbox", "", p1, p2)
	// --table instead of ?table=.
	expect(t, exitOK, []string{"outbox", "stats", "--store", "sqlite://" + path, "--table", "events_outbox"}, "pending")
	// A table that predates parking: a failure with a hint.
	if _, err := db.Exec(`CREATE TABLE old_outbox (seq INTEGER PRIMARY KEY, id TEXT, destination TEXT, ordering_key TEXT,
	headers TEXT, body BLOB, created_at INTEGER, sent_at INTEGER, attempts INTEGER, available_at INTEGER)`); err != nil {
		t.Fatal(err)
	}
	expect(t, exitFailure, []string{"outbox", "list", "--store", "sqlite://" + path + "?table=old_outbox"}, "parked_at", "Migrate")
}

// sqlWrite commits msgs through write in one transaction on db.
func sqlWrite(db *sql.DB, write func(context.Context, *sql.Tx, ...*outbox.Message) error) func(context.Context, ...*outbox.Message) error {
	return func(ctx context.Context, msgs ...*outbox.Message) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := write(ctx, tx, msgs...); err != nil {
			return err
		}
		return tx.Commit()
	}
}

func TestOutboxPostgres(t *testing.T) {
	base := postgresURL(t)
	const secret = "Sup3rS3cretPW"
	ctx := context.Background()
	table := "idemq_cli_outbox_" + randomHex(4)
	pool, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+table) })
	o, err := pgoutbox.New(pgoutbox.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	p1, p2 := seedParked(t, o.Store(pool), func(ctx context.Context, msgs ...*outbox.Message) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if err := o.Write(ctx, tx, msgs...); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	checkOutboxCommands(t, withSecret(base, secret)+sep+"table="+table, secret, p1, p2)
}

func TestOutboxMySQL(t *testing.T) {
	cfg, err := servicetest.ParseMySQL(servicetest.MySQLURL(t))
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	table := "idemq_cli_outbox_" + randomHex(4)
	o, err := mysqloutbox.New(mysqloutbox.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec(`DROP TABLE IF EXISTS ` + table + `, ` + table + `_locks`) })
	if err := o.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	p1, p2 := seedParked(t, o.Store(db), sqlWrite(db, o.Write))
	user := url.User(cfg.User)
	if cfg.Passwd != "" {
		user = url.UserPassword(cfg.User, cfg.Passwd)
	}
	u := url.URL{Scheme: "mysql", User: user, Host: cfg.Addr, Path: "/" + cfg.DBName, RawQuery: "table=" + table}
	checkOutboxCommands(t, u.String(), cfg.Passwd, p1, p2)
	// A wrong password fails (exit 1) without showing it.
	bad := url.URL{Scheme: "mysql", User: url.UserPassword(cfg.User, "Wr0ngPassw0rd"), Host: cfg.Addr, Path: "/" + cfg.DBName}
	if r := expect(t, exitFailure, []string{"outbox", "stats", "--store", bad.String()}); strings.Contains(r.stderr, "Wr0ngPassw0rd") || r.stderr == "" {
		t.Fatalf("a wrong password: %s", r)
	}
}
