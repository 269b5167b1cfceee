package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/drain"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/mysql"
	"github.com/idemq/idemq/stores/storetest"
)

// leastPrivilegeGrants are the grants in docs/stores.md (least privilege) for a consumer's user on
// the dedup table: claims are INSERT … ON DUPLICATE KEY UPDATE (a no-op
// update that tells a duplicate from other errors without INSERT IGNORE),
// so MySQL wants UPDATE as well.
const leastPrivilegeGrants = "SELECT, INSERT, UPDATE, DELETE"

// TestLeastPrivilege runs Migrate as the owner (root), then a consumer as
// a user with only the grants in docs/stores.md (least privilege) on the dedup table (no CREATE,
// ALTER, DROP): opening with migrate=false, claims, duplicates, a
// fingerprint mismatch, Prune and Inspect work; Migrate and DDL are
// refused.
func TestLeastPrivilege(t *testing.T) {
	base := mysqlDSN(t)
	db := testDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owner := openStore(t, db)
	table := owner.Table()
	effects := effectsTable(t, db)
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		t.Fatal(err)
	}

	user := storetest.UniqueName("lp_")
	pass := "lp-" + user
	// Every host form a loopback login may match, so that no anonymous
	// account shadows the user.
	hosts := []string{"%", "localhost", "127.0.0.1"}
	for _, h := range hosts {
		for _, q := range []string{
			fmt.Sprintf(`CREATE USER '%s'@'%s' IDENTIFIED BY '%s'`, user, h, pass),
			fmt.Sprintf(`GRANT %s ON %s.%s TO '%s'@'%s'`, leastPrivilegeGrants, cfg.DBName, table, user, h),
			fmt.Sprintf(`GRANT SELECT, INSERT ON %s.%s TO '%s'@'%s'`, cfg.DBName, effects, user, h),
		} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	t.Cleanup(func() {
		for _, h := range hosts {
			db.Exec(fmt.Sprintf(`DROP USER IF EXISTS '%s'@'%s'`, user, h))
		}
	})

	u := url.URL{Scheme: "mysql", User: url.UserPassword(user, pass), Host: cfg.Addr, Path: "/" + cfg.DBName,
		RawQuery: url.Values{"table": {table}}.Encode()}
	if _, err := core.OpenStore[*sql.Tx](ctx, u.String()); err == nil || !strings.Contains(err.Error(), "denied") {
		t.Fatalf("Open with migrate as the user: %v; want command denied", err)
	}
	u.RawQuery = url.Values{"table": {table}, "migrate": {"false"}}.Encode()
	st, err := core.OpenStore[*sql.Tx](ctx, u.String())
	if err != nil {
		t.Fatalf("Open with migrate=false as the user: %v", err)
	}
	s := st.(*mysql.Store)
	defer s.Close()
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE `+user+`_x (a int)`); err == nil || !strings.Contains(err.Error(), "denied") {
		t.Errorf("DDL as the user: %v; want denied", err)
	}
	if _, err := s.DB().ExecContext(ctx, `DROP TABLE `+table); err == nil || !strings.Contains(err.Error(), "denied") {
		t.Errorf("DROP as the user: %v; want denied", err)
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
	handler := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO `+effects+` (k) VALUES (?)`, m.ID)
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	res, err := drain.Drain(ctx, b, "q", func(sub *memory.Subscription) (*core.Consumer[*sql.Tx], error) {
		return core.New[*sql.Tx](sub, s, handler, core.WithName("lp"), core.WithBatchSize(5),
			core.WithIsolation(core.IsolateSavepoints), core.WithLogger(quiet))
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Processed != 20 || res.Duplicates != 2 || res.DeadLettered != 1 || res.Retried != 0 {
		t.Fatalf("as the user: %+v; want 20 processed, 2 duplicates, 1 dead letter (fingerprint), no retries", res.Stats)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+effects).Scan(&n); err != nil || n != 20 {
		t.Fatalf("effects %d, %v; want 20", n, err)
	}
	if pruned, err := s.Prune(ctx, time.Now().Add(time.Hour), 100); err != nil || pruned != 20 {
		t.Errorf("Prune as the user: %d, %v; want 20 rows", pruned, err)
	}
	if _, err := s.Inspect(ctx); err != nil {
		t.Errorf("Inspect as the user: %v", err)
	}
}
