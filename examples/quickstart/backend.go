package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	_ "github.com/idemq/idemq/stores/mysql"
	_ "github.com/idemq/idemq/stores/postgres"
	_ "github.com/idemq/idemq/stores/sqlite"
)

// backend is the business database of one run: the dedup store plus the
// accounts and ledger tables the handler writes, in the same database.
type backend[Tx any] struct {
	store   driver.Store[Tx]
	handler func(ctx context.Context, tx Tx, id string, p payment) error
	// balances returns account → balance; ledger returns the ledger's row
	// count, the ids with more than one row, and the distinct ids.
	balances func(ctx context.Context) (map[string]int64, error)
	ledger   func(ctx context.Context) (rows, doubled, distinct int, err error)
	close    func()
}

// storeURL picks the store of one run: a fresh SQLite file by default, or
// the --store URL, on which each run gets tables of its own.
func storeURL(s settings, dir string, batch int) string {
	if s.store == "" {
		return "sqlite://" + filepath.Join(dir, fmt.Sprintf("batch-%d.db", batch))
	}
	return s.store
}

func randomSuffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// openSQL opens a database/sql store (SQLite or MySQL) and creates the run's
// tables. The ledger has no unique key on purpose: only idemq stands between
// a duplicate and a double charge.
func openSQL(ctx context.Context, url string, keep bool) (*backend[*sql.Tx], error) {
	store, err := core.OpenStore[*sql.Tx](ctx, url)
	if err != nil {
		return nil, err
	}
	db := store.(interface{ DB() *sql.DB }).DB()
	closeStore := func() { store.(interface{ Close() error }).Close() }
	mysql := strings.HasPrefix(url, "mysql:")
	sfx := randomSuffix()
	accounts, ledger := "qs_accounts_"+sfx, "qs_ledger_"+sfx
	idType, upsert := "TEXT", `INSERT INTO `+accounts+` (account, balance_cents) VALUES (?, ?)
		ON CONFLICT (account) DO UPDATE SET balance_cents = balance_cents + excluded.balance_cents`
	if mysql {
		idType, upsert = "VARCHAR(255)", `INSERT INTO `+accounts+` (account, balance_cents) VALUES (?, ?)
			ON DUPLICATE KEY UPDATE balance_cents = balance_cents + VALUES(balance_cents)`
	}
	for _, ddl := range []string{
		`CREATE TABLE ` + accounts + ` (account ` + idType + ` PRIMARY KEY, balance_cents BIGINT NOT NULL)`,
		`CREATE TABLE ` + ledger + ` (message_id ` + idType + ` NOT NULL, account ` + idType + ` NOT NULL, amount_cents BIGINT NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			closeStore()
			return nil, fmt.Errorf("creating tables: %w", err)
		}
	}
	b := &backend[*sql.Tx]{store: store}
	b.handler = func(ctx context.Context, tx *sql.Tx, id string, p payment) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+ledger+` (message_id, account, amount_cents) VALUES (?, ?, ?)`, id, p.Account, p.Amount); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, upsert, p.Account, p.Amount)
		return err
	}
	b.balances = func(ctx context.Context) (map[string]int64, error) {
		rows, err := db.QueryContext(ctx, `SELECT account, balance_cents FROM `+accounts)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := map[string]int64{}
		for rows.Next() {
			var a string
			var v int64
			if err := rows.Scan(&a, &v); err != nil {
				return nil, err
			}
			out[a] = v
		}
		return out, rows.Err()
	}
	b.ledger = func(ctx context.Context) (n, doubled, distinct int, err error) {
		err = db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM `+ledger+`),
			(SELECT count(*) FROM (SELECT message_id FROM `+ledger+` GROUP BY message_id HAVING count(*) > 1) d),
			(SELECT count(DISTINCT message_id) FROM `+ledger+`)`).Scan(&n, &doubled, &distinct)
		return
	}
	b.close = func() {
		if !keep {
			db.ExecContext(context.Background(), `DROP TABLE `+accounts)
			db.ExecContext(context.Background(), `DROP TABLE `+ledger)
		}
		closeStore()
	}
	return b, nil
}

// openPostgres opens the Postgres store (handlers get a pgx.Tx) and
// creates the run's tables.
func openPostgres(ctx context.Context, url string, keep bool) (*backend[pgx.Tx], error) {
	store, err := core.OpenStore[pgx.Tx](ctx, url)
	if err != nil {
		return nil, err
	}
	pool := store.(interface{ Pool() *pgxpool.Pool }).Pool()
	closeStore := func() { store.(interface{ Close() error }).Close() }
	sfx := randomSuffix()
	accounts, ledger := "qs_accounts_"+sfx, "qs_ledger_"+sfx
	if _, err := pool.Exec(ctx, `CREATE TABLE `+accounts+` (account TEXT PRIMARY KEY, balance_cents BIGINT NOT NULL);
		CREATE TABLE `+ledger+` (message_id TEXT NOT NULL, account TEXT NOT NULL, amount_cents BIGINT NOT NULL)`); err != nil {
		closeStore()
		return nil, fmt.Errorf("creating tables: %w", err)
	}
	b := &backend[pgx.Tx]{store: store}
	b.handler = func(ctx context.Context, tx pgx.Tx, id string, p payment) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` (message_id, account, amount_cents) VALUES ($1, $2, $3)`, id, p.Account, p.Amount); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+accounts+` (account, balance_cents) VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET balance_cents = `+accounts+`.balance_cents + EXCLUDED.balance_cents`, p.Account, p.Amount)
		return err
	}
	b.balances = func(ctx context.Context) (map[string]int64, error) {
		rows, err := pool.Query(ctx, `SELECT account, balance_cents FROM `+accounts)
		if err != nil {
			return nil, err
		}
		out := map[string]int64{}
		var a string
		var v int64
		_, err = pgx.ForEachRow(rows, []any{&a, &v}, func() error { out[a] = v; return nil })
		return out, err
	}
	b.ledger = func(ctx context.Context) (n, doubled, distinct int, err error) {
		err = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+ledger+`),
			(SELECT count(*) FROM (SELECT message_id FROM `+ledger+` GROUP BY message_id HAVING count(*) > 1) d),
			(SELECT count(DISTINCT message_id) FROM `+ledger+`)`).Scan(&n, &doubled, &distinct)
		return
	}
	b.close = func() {
		if !keep {
			pool.Exec(context.Background(), `DROP TABLE `+accounts+`, `+ledger)
		}
		closeStore()
	}
	return b, nil
}
