package benchmark

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/mysql"
)

// mysqlStore is the MariaDB/MySQL side of a run: a database/sql handle on
// go-sql-driver/mysql for the baselines, setup and checks, and the user's
// URL for idemq's store (stores/mysql).
type mysqlStore struct {
	db  *sql.DB
	url *url.URL // Config.Store
}

// mysqlStoreParams are the parameters of a mysql:// URL that idemq's store
// reads; the driver gets the rest.
var mysqlStoreParams = []string{"table", "retention", "isolation", "migrate"}

func newMySQL(ctx context.Context, u *url.URL) (*mysqlStore, error) {
	raw := *u
	q := raw.Query()
	for _, k := range mysqlStoreParams {
		q.Del(k)
	}
	raw.RawQuery = q.Encode()
	dsn := raw.String()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("benchmark: Config.Store: %s", core.RedactError(err, u.String()))
	}
	// As idemq's store does (and as a hand-tuned consumer would): one
	// round trip per statement instead of prepare, execute, close.
	if !strings.Contains(dsn, "interpolateParams") {
		cfg.InterpolateParams = true
	}
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("benchmark: Config.Store: %s", core.RedactError(err, u.String()))
	}
	db := sql.OpenDB(conn)
	// database/sql keeps 2 idle connections by default: 8 seed workers
	// would open and close connections all the time.
	db.SetMaxIdleConns(16)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("benchmark: connecting to %s: %s", core.Redact(u.String()), core.RedactError(err, u.String()))
	}
	return &mysqlStore{db: db, url: u}, nil
}

func (m *mysqlStore) close() { m.db.Close() }

func (m *mysqlStore) version(ctx context.Context) string {
	var v string
	if err := m.db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&v); err != nil {
		return ""
	}
	if strings.Contains(v, "MariaDB") {
		return v
	}
	return "MySQL " + v
}

func (m *mysqlStore) describe(name string) string {
	switch name {
	case IdemqQueue:
		// stores/mysql has no statement queue like postgres.Queue.
		return "idemq batch mode, per-message handler (one UPDATE each, no statement queue on MySQL), IsolateReplay"
	}
	return ""
}

// idemqStoreURL is Config.Store with table as the dedup table. conns is
// applied to the store's handle by runIdemq (the URL has no pool size).
func (m *mysqlStore) idemqStoreURL(table string, _ int) string {
	u := *m.url
	q := u.Query()
	q.Set("table", table)
	u.RawQuery = q.Encode()
	return u.String()
}

func (m *mysqlStore) setup(ctx context.Context, e *runEnv, dedup bool) error {
	if _, err := m.db.ExecContext(ctx, `CREATE TABLE `+e.accountsTable+` (
	account       VARCHAR(64) NOT NULL PRIMARY KEY,
	balance_cents BIGINT      NOT NULL DEFAULT 0) ENGINE=InnoDB`); err != nil {
		return err
	}
	for start := 0; start < e.cfg.Accounts; start += 1000 {
		var b strings.Builder
		b.WriteString(`INSERT INTO ` + e.accountsTable + ` (account) VALUES `)
		for a := start; a < min(start+1000, e.cfg.Accounts); a++ {
			if a > start {
				b.WriteByte(',')
			}
			b.WriteString("('" + accountName(a) + "')")
		}
		if _, err := m.db.ExecContext(ctx, b.String()); err != nil {
			return err
		}
	}
	if !dedup {
		return nil
	}
	_, err := m.db.ExecContext(ctx, `CREATE TABLE `+e.dedupTable+` (
	consumer     VARBINARY(255) NOT NULL,
	message_id   VARBINARY(255) NOT NULL,
	processed_at DATETIME(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	PRIMARY KEY (consumer, message_id)) ENGINE=InnoDB`)
	return err
}

func (m *mysqlStore) drop(ctx context.Context, e *runEnv) {
	m.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+e.accountsTable)
	if !e.keepDedup {
		// With the lease table the store's Migrate makes beside it.
		m.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+e.dedupTable+`, `+e.dedupTable+`_leases`)
	}
}

// seedTx is the seed pattern on MySQL: INSERT IGNORE into the dedup table,
// no row affected means a duplicate (rolled back), else the UPDATE and
// COMMIT.
func (m *mysqlStore) seedTx(ctx context.Context, e *runEnv, msg *msg) (bool, error) {
	pay, err := decodePayment(msg.body)
	if err != nil {
		return false, err
	}
	for attempt := 1; ; attempt++ {
		dup, err := func() (bool, error) {
			tx, err := m.db.BeginTx(ctx, nil)
			if err != nil {
				return false, err
			}
			defer tx.Rollback()
			res, err := tx.ExecContext(ctx, `INSERT IGNORE INTO `+e.dedupTable+` (consumer, message_id) VALUES (?, ?)`, e.consumer, msg.id)
			if err != nil {
				return false, err
			}
			if n, err := res.RowsAffected(); err != nil || n == 0 {
				return true, err // the deferred rollback ends it
			}
			if _, err := tx.ExecContext(ctx, `UPDATE `+e.accountsTable+` SET balance_cents = balance_cents + ? WHERE account = ?`, pay.AmountCents, pay.Account); err != nil {
				return false, err
			}
			return false, tx.Commit()
		}()
		if err == nil || attempt >= 5 || !mysqlRetryable(err) {
			return dup, err
		}
		time.Sleep(time.Duration(attempt) * 5 * time.Millisecond)
	}
}

// mysqlRetryable reports a deadlock or lock wait timeout: the transaction
// is re-run.
func mysqlRetryable(err error) bool {
	var me *mysqldrv.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// mysqlSetUpdate is the set-based effect for n accounts: UPDATE … JOIN a
// derived table of (account, amount) rows.
func mysqlSetUpdate(table string, n int) string {
	return `UPDATE ` + table + ` a JOIN (SELECT ? AS acc, ? AS amt` + strings.Repeat(` UNION ALL SELECT ?, ?`, n-1) +
		`) v ON a.account = v.acc SET a.balance_cents = a.balance_cents + v.amt`
}

func setUpdateArgs(accs []string, amts []int64) []any {
	args := make([]any, 0, 2*len(accs))
	for i := range accs {
		args = append(args, accs[i], amts[i])
	}
	return args
}

// batchTx is the hand-tuned batch transaction on MariaDB: one multi-row
// INSERT IGNORE … RETURNING claim of the batch's distinct ids (sorted; the
// rows returned are the ones inserted, i.e. the claims won), the amounts of
// the ids won summed per account, one UPDATE … JOIN of those sums
// (accounts sorted), one commit. A deadlock or lock wait timeout re-runs
// it. (RETURNING is MariaDB 10.5+; MySQL would need a read-back.)
func (m *mysqlStore) batchTx(ctx context.Context, e *runEnv, b []msg) (int, error) {
	ids, pays, err := batchPayments(b)
	if err != nil {
		return 0, err
	}
	claim := `INSERT IGNORE INTO ` + e.dedupTable + ` (consumer, message_id) VALUES (?, ?)` +
		strings.Repeat(`, (?, ?)`, len(ids)-1) + ` RETURNING message_id`
	args := make([]any, 0, 2*len(ids))
	for _, id := range ids {
		args = append(args, e.consumer, id)
	}
	for attempt := 1; ; attempt++ {
		won, err := func() (int, error) {
			tx, err := m.db.BeginTx(ctx, nil)
			if err != nil {
				return 0, err
			}
			defer tx.Rollback()
			rows, err := tx.QueryContext(ctx, claim, args...)
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
			rows.Close()
			if len(won) > 0 {
				accs, amts := sumByAccount(won, pays)
				if _, err := tx.ExecContext(ctx, mysqlSetUpdate(e.accountsTable, len(accs)), setUpdateArgs(accs, amts)...); err != nil {
					return 0, err
				}
			}
			return len(won), tx.Commit()
		}()
		if err == nil {
			return won, nil
		}
		if attempt < 5 && mysqlRetryable(err) {
			time.Sleep(time.Duration(attempt) * 5 * time.Millisecond)
			continue
		}
		return 0, fmt.Errorf("hand-batch transaction: %w", err)
	}
}

func (m *mysqlStore) check(ctx context.Context, e *runEnv, paced int) error {
	var rows int64
	if err := m.db.QueryRowContext(ctx, `SELECT count(*) FROM `+e.dedupTable+` WHERE consumer = ?`, e.consumer).Scan(&rows); err != nil {
		return err
	}
	r, err := m.db.QueryContext(ctx, `SELECT account, balance_cents FROM `+e.accountsTable)
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

// runIdemq runs an idemq configuration on MySQL: *sql.Tx handlers, one
// UPDATE per message, or a set-based BatchHandler (one UPDATE … JOIN per
// batch).
func (m *mysqlStore) runIdemq(ctx context.Context, e *runEnv, t *tracker, name string) (*counts, error) {
	stages := &stageTimer{t: t}
	opts, shape, conns := idemqOptions(e, t, name, stages)
	update := `UPDATE ` + e.accountsTable + ` SET balance_cents = balance_cents + ? WHERE account = ?`
	var h core.Handler[*sql.Tx]
	var bh core.BatchHandler[*sql.Tx]
	if shape == shapeBatch {
		bh = func(ctx context.Context, tx *sql.Tx, msgs []*core.Message) error {
			accs, amts, err := coreSums(msgs)
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, mysqlSetUpdate(e.accountsTable, len(accs)), setUpdateArgs(accs, amts)...)
			return err
		}
	} else {
		h = func(ctx context.Context, tx *sql.Tx, msg *core.Message) error {
			p, err := decodePayment(msg.Body)
			if err != nil {
				return core.Permanent(err)
			}
			_, err = tx.ExecContext(ctx, update, p.AmountCents, p.Account)
			return err
		}
	}
	return runConsumer(ctx, e, m.idemqStoreURL(e.dedupTable, conns), stages, handlers(opts, h, bh), func(store any) {
		// The mysql:// URL has no pool size: keep as many idle
		// connections as the configuration runs transactions at once,
		// as the baselines do, through the store's handle.
		if s, ok := store.(*mysql.Store); ok {
			s.DB().SetMaxIdleConns(conns + 2)
		}
	})
}
