package benchmark

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/core"
	_ "github.com/idemq/idemq/stores/postgres" // the postgres:// scheme of core.OpenStore
)

// pgStore is the Postgres side of a run: a pgx pool for the baselines,
// setup and checks, and the user's URL for idemq's store.
type pgStore struct {
	pool *pgxpool.Pool
	url  *url.URL // Config.Store
}

func newPostgres(ctx context.Context, u *url.URL) (*pgStore, error) {
	pcfg, err := pgxpool.ParseConfig(rawStoreURL(u))
	if err != nil {
		return nil, fmt.Errorf("benchmark: Config.Store: %s", core.RedactError(err, u.String()))
	}
	pcfg.MaxConns = max(pcfg.MaxConns, 36) // 8 seed workers or up to 32 Watermill handlers, plus setup and checks (opened as needed)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		return nil, fmt.Errorf("benchmark: connecting to %s: %s", core.Redact(u.String()), core.RedactError(err, u.String()))
	}
	return &pgStore{pool: pool, url: u}, nil
}

func (p *pgStore) close() { p.pool.Close() }

func (p *pgStore) version(ctx context.Context) string {
	var ver string
	if err := p.pool.QueryRow(ctx, `SELECT version()`).Scan(&ver); err != nil {
		return ""
	}
	if i := strings.Index(ver, " on "); i > 0 {
		ver = ver[:i]
	}
	return ver
}

func (p *pgStore) describe(string) string { return "" }

// idemqStoreURL is Config.Store with table as the dedup table and a pool
// big enough for conns connections (unless the URL sets its own).
func (p *pgStore) idemqStoreURL(table string, conns int) string {
	u := *p.url
	q := u.Query()
	q.Set("table", table)
	if !q.Has("pool_max_conns") {
		q.Set("pool_max_conns", strconv.Itoa(conns))
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// rawStoreURL is Config.Store without idemq's store parameters, for pgx.
func rawStoreURL(u *url.URL) string {
	c := *u
	q := c.Query()
	for _, k := range []string{"table", "retention", "partitions"} {
		q.Del(k)
	}
	c.RawQuery = q.Encode()
	return c.String()
}

// setup creates the run's accounts (all at zero) and, for the baselines,
// the dedup table (the idemq store migrates its own).
func (p *pgStore) setup(ctx context.Context, e *runEnv, dedup bool) error {
	if _, err := p.pool.Exec(ctx, `CREATE TABLE `+e.accountsTable+` (account TEXT PRIMARY KEY, balance_cents BIGINT NOT NULL DEFAULT 0)`); err != nil {
		return err
	}
	if _, err := p.pool.Exec(ctx, `INSERT INTO `+e.accountsTable+` (account) SELECT 'acc-' || g FROM generate_series(0, $1::int - 1) g`, e.cfg.Accounts); err != nil {
		return err
	}
	if _, err := p.pool.Exec(ctx, `ANALYZE `+e.accountsTable); err != nil {
		return err
	}
	if !dedup {
		return nil
	}
	_, err := p.pool.Exec(ctx, `CREATE TABLE `+e.dedupTable+` (
	consumer     TEXT        NOT NULL,
	message_id   TEXT        NOT NULL,
	processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_id))`)
	return err
}

func (p *pgStore) drop(ctx context.Context, e *runEnv) {
	tables := []string{e.accountsTable, e.ledgerTable}
	if !e.keepDedup {
		// The store keeps leased claims in a table of their own beside
		// the dedup table.
		tables = append(tables, e.dedupTable, e.dedupTable+"_leases")
	}
	p.pool.Exec(ctx, `DROP TABLE IF EXISTS `+strings.Join(tables, ", "))
}

// seedTx is the seed article's transaction (seeds/003): claim with
// INSERT … ON CONFLICT DO NOTHING, the UPDATE, COMMIT; a lost claim rolls
// back.
func (p *pgStore) seedTx(ctx context.Context, e *runEnv, m *msg) (bool, error) {
	pay, err := decodePayment(m.body)
	if err != nil {
		return false, err
	}
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	tag, err := tx.Exec(ctx, `INSERT INTO `+e.dedupTable+` (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, e.consumer, m.id)
	if err != nil {
		return false, err
	}
	if tag.RowsAffected() == 0 {
		return true, nil // the deferred rollback ends it
	}
	if _, err := tx.Exec(ctx, `UPDATE `+e.accountsTable+` SET balance_cents = balance_cents + $1 WHERE account = $2`, pay.AmountCents, pay.Account); err != nil {
		return false, err
	}
	return false, tx.Commit(ctx)
}

// batchTx is the hand-tuned batch transaction: one multi-row claim of the
// batch's distinct ids (INSERT … SELECT unnest … ON CONFLICT DO NOTHING
// RETURNING, sorted), the amounts of the ids won summed per account, one
// set-based UPDATE … FROM unnest (accounts sorted), one commit. A deadlock
// or serialization failure re-runs it.
func (p *pgStore) batchTx(ctx context.Context, e *runEnv, b []msg) (int, error) {
	claim := `INSERT INTO ` + e.dedupTable + ` (consumer, message_id)
SELECT $1, id FROM unnest($2::text[]) AS u(id) ORDER BY id
ON CONFLICT DO NOTHING RETURNING message_id`
	update := `UPDATE ` + e.accountsTable + ` a SET balance_cents = a.balance_cents + v.amt
FROM (SELECT unnest($1::text[]) AS acc, unnest($2::bigint[]) AS amt) v WHERE a.account = v.acc`
	ids, pays, err := batchPayments(b)
	if err != nil {
		return 0, err
	}
	for attempt := 1; ; attempt++ {
		won, err := func() (int, error) {
			tx, err := p.pool.Begin(ctx)
			if err != nil {
				return 0, err
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			rows, err := tx.Query(ctx, claim, e.consumer, ids)
			if err != nil {
				return 0, err
			}
			var won []string
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					rows.Close()
					return 0, err
				}
				won = append(won, id)
			}
			if err := rows.Err(); err != nil {
				return 0, err
			}
			if len(won) > 0 {
				accs, amts := sumByAccount(won, pays)
				if _, err := tx.Exec(ctx, update, accs, amts); err != nil {
					return 0, err
				}
			}
			return len(won), tx.Commit(ctx)
		}()
		if err == nil {
			// Deliveries of an id seen twice in the batch count as
			// duplicates: only the first could win.
			return won, nil
		}
		var pe *pgconn.PgError
		if attempt < 5 && errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001") {
			time.Sleep(time.Duration(attempt) * 5 * time.Millisecond)
			continue
		}
		return 0, fmt.Errorf("hand-batch transaction: %w", err)
	}
}

// check is the correctness check: every account's balance is the sum of
// its messages' amounts, each applied once, and the dedup table holds
// exactly one row per unique id for the run's consumer.
func (p *pgStore) check(ctx context.Context, e *runEnv, paced int) error {
	var rows int64
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.dedupTable+` WHERE consumer = $1`, e.consumer).Scan(&rows); err != nil {
		return err
	}
	r, err := p.pool.Query(ctx, `SELECT account, balance_cents FROM `+e.accountsTable)
	if err != nil {
		return err
	}
	defer r.Close()
	got := map[string]int64{}
	for r.Next() {
		var acc string
		var bal int64
		if err := r.Scan(&acc, &bal); err != nil {
			return err
		}
		got[acc] = bal
	}
	if err := r.Err(); err != nil {
		return err
	}
	return compareBalances(e, paced, rows, got)
}

// compareBalances compares the dedup rows of the run's consumer and the
// balances read back with what the workload makes them.
func compareBalances(e *runEnv, paced int, rows int64, got map[string]int64) error {
	if want := int64(e.w.n + paced); rows != want {
		return fmt.Errorf("%d rows in %s for consumer %s, want %d (one per unique id)", rows, e.dedupTable, e.consumer, want)
	}
	want := e.w.expected(paced)
	if len(got) != len(want) {
		return fmt.Errorf("%d accounts, want %d", len(got), len(want))
	}
	wrong := 0
	var example string
	for acc, bal := range got {
		if bal != want[acc] {
			if wrong == 0 {
				example = fmt.Sprintf("%s has %d, want %d", acc, bal, want[acc])
			}
			wrong++
		}
	}
	if wrong > 0 {
		return fmt.Errorf("%d of %d balances wrong (e.g. %s)", wrong, len(got), example)
	}
	return nil
}

// fill creates table with the Postgres store's schema and rows old claims
// of another consumer, set-based, with the keys built after the insert
// (much faster than row by row into the index).
func (p *pgStore) fill(ctx context.Context, table string, rows int) error {
	stmts := []string{
		`CREATE TABLE ` + table + ` (
	consumer     TEXT        NOT NULL,
	message_id   TEXT        NOT NULL,
	fingerprint  TEXT        NOT NULL DEFAULT '',
	processed_at TIMESTAMPTZ NOT NULL DEFAULT now())`,
		// Rows shaped as the runs' own (a 27-character consumer, 9-character
		// ids, 22-character fingerprints: 96 bytes). Old rows of another
		// shape (64-hex fingerprints, 'old-N' ids: 120 bytes) left about
		// 100 bytes free in every page, room for exactly one of the runs'
		// rows, so each batch of 200 dirtied 200 old pages, each with a
		// full-page image after the checkpoint (1.7 MB of WAL a batch
		// against 72 KB): that measured the shape, not the table's size.
		fmt.Sprintf(`INSERT INTO %s (consumer, message_id, fingerprint, processed_at)
SELECT 'bench-growth/old-0000000000', 'o' || CASE WHEN g < 100000000 THEN lpad(g::text, 8, '0') ELSE g::text END, left(md5(g::text), 22), now() - interval '30 days' + g * interval '1 millisecond'
FROM generate_series(1, %d) g`, table, rows),
		`ALTER TABLE ` + table + ` ADD PRIMARY KEY (consumer, message_id)`,
		`CREATE INDEX ` + table + `_processed_at_idx ON ` + table + ` (processed_at)`,
		`VACUUM ANALYZE ` + table,
		// The fill wrote gigabytes of WAL: without this, the checkpoint it
		// set off runs during the first measured runs (p99 ×7 seen).
		`CHECKPOINT`,
	}
	for _, st := range stmts {
		if _, err := p.pool.Exec(ctx, st); err != nil {
			return err
		}
	}
	return nil
}

// dropTable drops a dedup table and the lease table the store's Migrate
// made beside it.
func (p *pgStore) dropTable(ctx context.Context, table string) {
	p.pool.Exec(ctx, `DROP TABLE IF EXISTS `+table+`, `+table+`_leases`)
}
