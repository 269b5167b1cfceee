package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/core"
	_ "github.com/idemq/idemq/stores/mysql"
	_ "github.com/idemq/idemq/stores/postgres"
	_ "github.com/idemq/idemq/stores/sqlite"
)

// backend is the service's database: the dedup store and the handler that
// applies a payment in the store's transaction type (pgx.Tx for Postgres,
// *sql.Tx for MySQL and SQLite). Nothing here knows the broker.
type backend[Tx any] struct {
	store  core.Store[Tx]
	charge core.Handler[Tx]
	close  func()
}

// tableNames returns the ledger and accounts tables for a --tables prefix.
func tableNames(prefix string) (ledger, accounts string) {
	return prefix + "ledger", prefix + "accounts"
}

// openPostgres opens the Postgres store, creates the business tables and
// returns the pgx.Tx handler.
func openPostgres(ctx context.Context, s settings) (*backend[pgx.Tx], error) {
	store, err := core.OpenStore[pgx.Tx](ctx, s.store)
	if err != nil {
		return nil, err
	}
	closeStore := func() { store.(interface{ Close() error }).Close() }
	pool := store.(interface{ Pool() *pgxpool.Pool }).Pool()
	ledger, accounts := tableNames(s.tables)
	// The advisory lock serialises replicas starting at once (concurrent
	// CREATE TABLE IF NOT EXISTS can fail on pg_type's unique index).
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "payments."+ledger); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+accounts+` (
	account       TEXT   PRIMARY KEY,
	balance_cents BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS `+ledger+` (
	entry        BIGSERIAL   PRIMARY KEY,
	account      TEXT        NOT NULL,
	amount_cents BIGINT      NOT NULL,
	message_id   TEXT        NOT NULL,  -- deliberately not unique: idemq is the only guard
	booked_at    TIMESTAMPTZ NOT NULL DEFAULT now()
)`)
		return err
	})
	if err != nil {
		closeStore()
		return nil, fmt.Errorf("creating tables %s, %s: %w", ledger, accounts, err)
	}
	charge := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		p, err := decode(m.Body)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` (account, amount_cents, message_id) VALUES ($1, $2, $3)`,
			p.Account, p.AmountCents, m.ID); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+accounts+` (account, balance_cents) VALUES ($1, $2)
ON CONFLICT (account) DO UPDATE SET balance_cents = `+accounts+`.balance_cents + EXCLUDED.balance_cents`,
			p.Account, p.AmountCents)
		return err
	}
	return &backend[pgx.Tx]{store: store, charge: charge, close: closeStore}, nil
}

// openSQL opens a database/sql store (MySQL/MariaDB or SQLite), creates
// the business tables and returns the *sql.Tx handler.
func openSQL(ctx context.Context, s settings, d dialect) (*backend[*sql.Tx], error) {
	store, err := core.OpenStore[*sql.Tx](ctx, s.store)
	if err != nil {
		return nil, err
	}
	closeStore := func() { store.(interface{ Close() error }).Close() }
	db := store.(interface{ DB() *sql.DB }).DB()
	ledger, accounts := tableNames(s.tables)
	ddl := []string{
		`CREATE TABLE IF NOT EXISTS ` + accounts + ` (account TEXT PRIMARY KEY, balance_cents INTEGER NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS ` + ledger + ` (entry INTEGER PRIMARY KEY AUTOINCREMENT,
	account TEXT NOT NULL, amount_cents INTEGER NOT NULL, message_id TEXT NOT NULL,
	booked_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)`,
	}
	upsert := `INSERT INTO ` + accounts + ` (account, balance_cents) VALUES (?, ?)
ON CONFLICT (account) DO UPDATE SET balance_cents = balance_cents + excluded.balance_cents`
	if d == dialectMySQL {
		ddl = []string{
			`CREATE TABLE IF NOT EXISTS ` + accounts + ` (account VARCHAR(255) PRIMARY KEY, balance_cents BIGINT NOT NULL) ENGINE=InnoDB`,
			`CREATE TABLE IF NOT EXISTS ` + ledger + ` (entry BIGINT AUTO_INCREMENT PRIMARY KEY,
	account VARCHAR(255) NOT NULL, amount_cents BIGINT NOT NULL, message_id VARCHAR(255) NOT NULL,
	booked_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), KEY (message_id)) ENGINE=InnoDB`,
		}
		upsert = `INSERT INTO ` + accounts + ` (account, balance_cents) VALUES (?, ?)
ON DUPLICATE KEY UPDATE balance_cents = balance_cents + VALUES(balance_cents)`
	}
	for _, stmt := range ddl {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			closeStore()
			return nil, fmt.Errorf("creating tables %s, %s: %w", ledger, accounts, err)
		}
	}
	charge := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		p, err := decode(m.Body)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+ledger+` (account, amount_cents, message_id) VALUES (?, ?, ?)`,
			p.Account, p.AmountCents, m.ID); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, upsert, p.Account, p.AmountCents)
		return err
	}
	return &backend[*sql.Tx]{store: store, charge: charge, close: closeStore}, nil
}
