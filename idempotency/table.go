package idempotency

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"reflect"
	"strings"
	"time"

	"github.com/idemq/idemq/stores/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// dialect is the SQL dialect of the responses table, told from the store's
// connection pool.
type dialect int

const (
	postgresDialect dialect = iota + 1
	mysqlDialect
	sqliteDialect
)

// sqliteTime is the text form of stored_at on SQLite (UTC), the one the
// SQLite store uses for its claims: it sorts as it compares.
const sqliteTime = "2006-01-02 15:04:05.000000"

// table is the stored responses' table in one dialect, with the pool its
// reads, Migrate and Prune use.
type table struct {
	d    dialect
	name string
	pg   *pgxpool.Pool
	db   *sql.DB

	insert, lookup string
}

// stored is one stored response.
type stored struct {
	status int
	header http.Header
	body   []byte
}

// newTable finds the store's pool (As) and with it the dialect.
func newTable(name string, as func(any) bool) (*table, error) {
	t := &table{name: name}
	switch {
	case as(&t.pg) && t.pg != nil:
		t.d = postgresDialect
	case as(&t.db) && t.db != nil:
		switch drv := strings.ToLower(reflect.TypeOf(t.db.Driver()).String()); {
		case strings.Contains(drv, "sqlite"):
			t.d = sqliteDialect
		case strings.Contains(drv, "mysql"):
			t.d = mysqlDialect
		default:
			return nil, fmt.Errorf("the store's *sql.DB driver %s is neither MySQL/MariaDB nor SQLite", drv)
		}
	default:
		return nil, errors.New("the store hands out neither a *pgxpool.Pool nor a *sql.DB (As)")
	}
	cols := "consumer, message_id, status, header, body, stored_at"
	switch t.d {
	case postgresDialect:
		t.insert = `INSERT INTO ` + name + ` (` + cols + `) VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (consumer, message_id) DO UPDATE SET status = EXCLUDED.status, header = EXCLUDED.header, body = EXCLUDED.body, stored_at = EXCLUDED.stored_at`
		t.lookup = `SELECT status, header, body FROM ` + name + ` WHERE consumer = $1 AND message_id = $2`
	case mysqlDialect:
		t.insert = `INSERT INTO ` + name + ` (` + cols + `) VALUES (?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE status = VALUES(status), header = VALUES(header), body = VALUES(body), stored_at = VALUES(stored_at)`
		t.lookup = `SELECT status, header, body FROM ` + name + ` WHERE consumer = ? AND message_id = ?`
	case sqliteDialect:
		t.insert = `INSERT INTO ` + name + ` (` + cols + `) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (consumer, message_id) DO UPDATE SET status = excluded.status, header = excluded.header, body = excluded.body, stored_at = excluded.stored_at`
		t.lookup = `SELECT status, header, body FROM ` + name + ` WHERE consumer = ? AND message_id = ?`
	}
	return t, nil
}

// ddl returns Migrate's statements, each idempotent.
func (t *table) ddl() []string {
	switch t.d {
	case postgresDialect:
		return []string{`CREATE TABLE IF NOT EXISTS ` + t.name + ` (
	consumer   TEXT        NOT NULL,
	message_id TEXT        NOT NULL,
	status     INTEGER     NOT NULL,
	header     TEXT        NOT NULL,
	body       BYTEA       NOT NULL,
	stored_at  TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (consumer, message_id)
)`, `CREATE INDEX IF NOT EXISTS ` + t.name + `_stored_at_idx ON ` + t.name + ` (stored_at)`}
	case mysqlDialect:
		// The key columns are those of the MySQL store's claims table:
		// VARBINARY, compared byte for byte.
		return []string{`CREATE TABLE IF NOT EXISTS ` + t.name + ` (
	consumer   VARBINARY(255)  NOT NULL,
	message_id VARBINARY(1024) NOT NULL,
	status     INT             NOT NULL,
	header     BLOB            NOT NULL,
	body       LONGBLOB        NOT NULL,
	stored_at  DATETIME(6)     NOT NULL,
	PRIMARY KEY (consumer, message_id),
	KEY ` + t.name + `_stored_at (stored_at)
) ENGINE=InnoDB`}
	default:
		return []string{`CREATE TABLE IF NOT EXISTS ` + t.name + ` (
	consumer   TEXT    NOT NULL,
	message_id TEXT    NOT NULL,
	status     INTEGER NOT NULL,
	header     TEXT    NOT NULL,
	body       BLOB    NOT NULL,
	stored_at  TEXT    NOT NULL,
	PRIMARY KEY (consumer, message_id)
)`, `CREATE INDEX IF NOT EXISTS ` + t.name + `_stored_at_idx ON ` + t.name + ` (stored_at)`}
	}
}

func (t *table) migrate(ctx context.Context) error {
	for _, s := range t.ddl() {
		if err := t.exec(ctx, nil, s); err != nil {
			return fmt.Errorf("idempotency: Migrate %s: %w", t.name, err)
		}
	}
	return nil
}

// at is a time as the dialect's stored_at column takes it.
func (t *table) at(now time.Time) any {
	if t.d == sqliteDialect {
		return now.UTC().Format(sqliteTime)
	}
	return now.UTC()
}

// put stores a response in tx, the handler's transaction, replacing one
// left by a claim that was pruned before its response.
func (t *table) put(ctx context.Context, tx any, consumer, id string, s stored, now time.Time) error {
	var h bytes.Buffer
	if err := s.header.Write(&h); err != nil {
		return err
	}
	body := s.body
	if body == nil {
		body = []byte{}
	}
	return t.exec(ctx, tx, t.insert, consumer, id, s.status, h.String(), body, t.at(now))
}

// get reads a stored response in tx (a pgx.Tx), or through the pool when
// tx is nil; found is false when there is none.
func (t *table) get(ctx context.Context, tx pgx.Tx, consumer, id string) (s stored, found bool, err error) {
	var h string
	var row interface{ Scan(...any) error }
	switch {
	case tx != nil:
		row = tx.QueryRow(ctx, t.lookup, consumer, id)
	case t.pg != nil:
		row = t.pg.QueryRow(ctx, t.lookup, consumer, id)
	default:
		row = t.db.QueryRowContext(ctx, t.lookup, consumer, id)
	}
	err = row.Scan(&s.status, &h, &s.body)
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) {
		return s, false, nil
	}
	if err != nil {
		return s, false, err
	}
	mh, err := textproto.NewReader(bufio.NewReader(strings.NewReader(h + "\r\n"))).ReadMIMEHeader()
	if err != nil {
		return s, false, fmt.Errorf("stored header of %q: %w", id, err)
	}
	s.header = http.Header(mh)
	return s, true, nil
}

// prune deletes at most limit responses stored before the given time.
func (t *table) prune(ctx context.Context, before time.Time, limit int) (int, error) {
	var q string
	switch t.d {
	case postgresDialect:
		q = `DELETE FROM ` + t.name + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + t.name + ` WHERE stored_at < $1 ORDER BY stored_at LIMIT $2 FOR UPDATE SKIP LOCKED))`
	case mysqlDialect:
		q = `DELETE FROM ` + t.name + ` WHERE stored_at < ? ORDER BY stored_at LIMIT ?`
	default:
		q = `DELETE FROM ` + t.name + ` WHERE rowid IN (SELECT rowid FROM ` + t.name + ` WHERE stored_at < ? ORDER BY stored_at LIMIT ?)`
	}
	if t.pg != nil {
		tag, err := t.pg.Exec(ctx, q, t.at(before), limit)
		return int(tag.RowsAffected()), err
	}
	res, err := t.db.ExecContext(ctx, q, t.at(before), limit)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// exec runs a statement in tx (a pgx.Tx or *sql.Tx), or through the pool
// when tx is nil.
func (t *table) exec(ctx context.Context, tx any, q string, args ...any) error {
	var err error
	switch h := tx.(type) {
	case nil:
		if t.pg != nil {
			_, err = t.pg.Exec(ctx, q, args...)
		} else {
			_, err = t.db.ExecContext(ctx, q, args...)
		}
	case pgx.Tx:
		// Queued to go with the COMMIT where the transaction is the
		// Postgres store's (FlushCommit), at once otherwise.
		err = postgres.Queue(ctx, h, q, args...)
	case interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}:
		_, err = h.ExecContext(ctx, q, args...)
	default:
		err = fmt.Errorf("the store's transaction handle %T takes no statements", tx)
	}
	return err
}
