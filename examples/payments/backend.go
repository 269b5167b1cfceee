package main

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	_ "github.com/idemq/idemq/stores/mysql"
	_ "github.com/idemq/idemq/stores/postgres"
	_ "github.com/idemq/idemq/stores/sqlite"
)

// backend is the service's database: the dedup store and the handler that
// applies payments in the store's transaction type (pgx.Tx for Postgres,
// *sql.Tx for MySQL and SQLite). Nothing here knows the broker.
//
// The handler is a core.BatchHandler: it gets every message of a batch
// whose claim won (one, at --batch 1) and books them set-based, one ledger
// INSERT and one balance upsert with the accounts in sorted order, so that
// concurrent batches (--concurrency) lock account rows in the same order
// and cannot deadlock. A per-message handler updating balances in arrival
// order deadlocks under concurrency, each deadlock costing Postgres'
// deadlock_timeout (1s by default) and a retry.
type backend[Tx any] struct {
	store  driver.Store[Tx]
	charge core.BatchHandler[Tx]
	// book is the leased mode's completion (--provider): one payment the
	// provider charged, booked with its charge id.
	book  func(ctx context.Context, tx Tx, m *core.Message, chargeID string) error
	close func()
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
	closeStore := func() { store.Close() }
	var pool *pgxpool.Pool
	if !store.As(&pool) {
		closeStore()
		return nil, fmt.Errorf("store %s hands out no *pgxpool.Pool", core.Redact(s.store))
	}
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
	charge_id    TEXT,                  -- the provider's, in the leased mode (--provider)
	booked_at    TIMESTAMPTZ NOT NULL DEFAULT now()
)`)
		return err
	})
	if err != nil {
		closeStore()
		return nil, fmt.Errorf("creating tables %s, %s: %w", ledger, accounts, err)
	}
	charge := func(ctx context.Context, tx pgx.Tx, msgs []*core.Message) error {
		b, err := decodeBatch(msgs)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` (account, amount_cents, message_id)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[])`, b.accounts, b.amounts, b.ids); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+accounts+` (account, balance_cents)
SELECT * FROM unnest($1::text[], $2::bigint[]) AS u(a, c) ORDER BY a
ON CONFLICT (account) DO UPDATE SET balance_cents = `+accounts+`.balance_cents + EXCLUDED.balance_cents`,
			b.totals.accounts, b.totals.cents)
		return err
	}
	book := func(ctx context.Context, tx pgx.Tx, m *core.Message, chargeID string) error {
		p, err := decode(m.Body)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` (account, amount_cents, message_id, charge_id) VALUES ($1, $2, $3, $4)`,
			p.Account, p.AmountCents, m.ID, chargeID); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+accounts+` (account, balance_cents) VALUES ($1, $2)
ON CONFLICT (account) DO UPDATE SET balance_cents = `+accounts+`.balance_cents + EXCLUDED.balance_cents`, p.Account, p.AmountCents)
		return err
	}
	return &backend[pgx.Tx]{store: store, charge: charge, book: book, close: closeStore}, nil
}

// openSQL opens a database/sql store (MySQL/MariaDB or SQLite), creates
// the business tables and returns the *sql.Tx handler.
func openSQL(ctx context.Context, s settings, d dialect) (*backend[*sql.Tx], error) {
	store, err := core.OpenStore[*sql.Tx](ctx, s.store)
	if err != nil {
		return nil, err
	}
	closeStore := func() { store.Close() }
	var db *sql.DB
	if !store.As(&db) {
		closeStore()
		return nil, fmt.Errorf("store %s hands out no *sql.DB", core.Redact(s.store))
	}
	ledger, accounts := tableNames(s.tables)
	ddl := []string{
		`CREATE TABLE IF NOT EXISTS ` + accounts + ` (account TEXT PRIMARY KEY, balance_cents INTEGER NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS ` + ledger + ` (entry INTEGER PRIMARY KEY AUTOINCREMENT,
	account TEXT NOT NULL, amount_cents INTEGER NOT NULL, message_id TEXT NOT NULL, charge_id TEXT,
	booked_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)`,
	}
	// %s: the VALUES rows, sorted by account.
	upsert := `INSERT INTO ` + accounts + ` (account, balance_cents) VALUES %s
ON CONFLICT (account) DO UPDATE SET balance_cents = balance_cents + excluded.balance_cents`
	if d == dialectMySQL {
		ddl = []string{
			`CREATE TABLE IF NOT EXISTS ` + accounts + ` (account VARCHAR(255) PRIMARY KEY, balance_cents BIGINT NOT NULL) ENGINE=InnoDB`,
			`CREATE TABLE IF NOT EXISTS ` + ledger + ` (entry BIGINT AUTO_INCREMENT PRIMARY KEY,
	account VARCHAR(255) NOT NULL, amount_cents BIGINT NOT NULL, message_id VARCHAR(255) NOT NULL, charge_id VARCHAR(255),
	booked_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), KEY (message_id)) ENGINE=InnoDB`,
		}
		upsert = `INSERT INTO ` + accounts + ` (account, balance_cents) VALUES %s
ON DUPLICATE KEY UPDATE balance_cents = balance_cents + VALUES(balance_cents)`
	}
	for _, stmt := range ddl {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			closeStore()
			return nil, fmt.Errorf("creating tables %s, %s: %w", ledger, accounts, err)
		}
	}
	charge := func(ctx context.Context, tx *sql.Tx, msgs []*core.Message) error {
		b, err := decodeBatch(msgs)
		if err != nil {
			return err
		}
		args := make([]any, 0, 3*len(b.ids))
		for i := range b.ids {
			args = append(args, b.accounts[i], b.amounts[i], b.ids[i])
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+ledger+` (account, amount_cents, message_id) VALUES `+
			placeholders(len(b.ids), "(?, ?, ?)"), args...); err != nil {
			return err
		}
		args = args[:0]
		for i := range b.totals.accounts {
			args = append(args, b.totals.accounts[i], b.totals.cents[i])
		}
		_, err = tx.ExecContext(ctx, fmt.Sprintf(upsert, placeholders(len(b.totals.accounts), "(?, ?)")), args...)
		return err
	}
	book := func(ctx context.Context, tx *sql.Tx, m *core.Message, chargeID string) error {
		p, err := decode(m.Body)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+ledger+` (account, amount_cents, message_id, charge_id) VALUES (?, ?, ?, ?)`,
			p.Account, p.AmountCents, m.ID, chargeID); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, fmt.Sprintf(upsert, "(?, ?)"), p.Account, p.AmountCents)
		return err
	}
	return &backend[*sql.Tx]{store: store, charge: charge, book: book, close: closeStore}, nil
}

// batch is a batch of payments in columns, with the per-account totals
// sorted by account.
type batch struct {
	ids, accounts []string
	amounts       []int64
	totals        struct {
		accounts []string
		cents    []int64
	}
}

// decodeBatch decodes every message of a batch. A bad body fails the whole
// batch; the Consumer then decides each message alone, so only the bad one
// is dead-lettered.
func decodeBatch(msgs []*core.Message) (batch, error) {
	var b batch
	sum := map[string]int64{}
	for _, m := range msgs {
		p, err := decode(m.Body)
		if err != nil {
			return b, fmt.Errorf("message %q: %w", m.ID, err)
		}
		b.ids = append(b.ids, m.ID)
		b.accounts = append(b.accounts, p.Account)
		b.amounts = append(b.amounts, p.AmountCents)
		sum[p.Account] += p.AmountCents
	}
	b.totals.accounts = slices.Sorted(maps.Keys(sum))
	for _, a := range b.totals.accounts {
		b.totals.cents = append(b.totals.cents, sum[a])
	}
	return b, nil
}

// placeholders repeats row n times, comma-separated.
func placeholders(n int, row string) string {
	return strings.TrimSuffix(strings.Repeat(row+", ", n), ", ")
}
