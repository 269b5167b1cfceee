package idempotency

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// sqliteTime is the text form of stored_at on SQLite (UTC), the one the
// SQLite store uses for its claims: it sorts as it compares.
const sqliteTime = "2006-01-02 15:04:05.000000"

// table is the stored responses' table, in the store's database and
// dialect (driver.SQLStore).
type table struct {
	d    driver.SQLDialect
	name string
	db   driver.SQLStore

	insert, lookup string
}

// stored is one stored response.
type stored struct {
	status int
	header http.Header
	body   []byte
}

// newTable returns the table name in the database of db.
func newTable(name string, db driver.SQLStore) (*table, error) {
	t := &table{d: db.SQLDialect(), name: name, db: db}
	cols := "consumer, message_id, status, header, body, stored_at"
	switch t.d {
	case driver.DialectPostgres:
		t.insert = `INSERT INTO ` + name + ` (` + cols + `) VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (consumer, message_id) DO UPDATE SET status = EXCLUDED.status, header = EXCLUDED.header, body = EXCLUDED.body, stored_at = EXCLUDED.stored_at`
		t.lookup = `SELECT status, header, body FROM ` + name + ` WHERE consumer = $1 AND message_id = $2`
	case driver.DialectMySQL:
		t.insert = `INSERT INTO ` + name + ` (` + cols + `) VALUES (?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE status = VALUES(status), header = VALUES(header), body = VALUES(body), stored_at = VALUES(stored_at)`
		t.lookup = `SELECT status, header, body FROM ` + name + ` WHERE consumer = ? AND message_id = ?`
	case driver.DialectSQLite:
		t.insert = `INSERT INTO ` + name + ` (` + cols + `) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (consumer, message_id) DO UPDATE SET status = excluded.status, header = excluded.header, body = excluded.body, stored_at = excluded.stored_at`
		t.lookup = `SELECT status, header, body FROM ` + name + ` WHERE consumer = ? AND message_id = ?`
	default:
		return nil, fmt.Errorf("the store's SQL dialect %q is none of %s, %s and %s", t.d, driver.DialectPostgres, driver.DialectMySQL, driver.DialectSQLite)
	}
	return t, nil
}

// ddl returns Migrate's statements, each idempotent.
func (t *table) ddl() []string {
	switch t.d {
	case driver.DialectPostgres:
		return []string{`CREATE TABLE IF NOT EXISTS ` + t.name + ` (
	consumer   TEXT        NOT NULL,
	message_id TEXT        NOT NULL,
	status     INTEGER     NOT NULL,
	header     TEXT        NOT NULL,
	body       BYTEA       NOT NULL,
	stored_at  TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (consumer, message_id)
)`, `CREATE INDEX IF NOT EXISTS ` + t.name + `_stored_at_idx ON ` + t.name + ` (stored_at)`}
	case driver.DialectMySQL:
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
		if _, err := t.db.ExecSQL(ctx, s); err != nil {
			return fmt.Errorf("idempotency: Migrate %s: %w", t.name, err)
		}
	}
	return nil
}

// at is a time as the dialect's stored_at column takes it.
func (t *table) at(now time.Time) any {
	if t.d == driver.DialectSQLite {
		return now.UTC().Format(sqliteTime)
	}
	return now.UTC()
}

// put stores a response in txn, the handler's transaction, replacing one
// left by a claim that was pruned before its response.
func (t *table) put(ctx context.Context, txn driver.SQLTxn, consumer, id string, s stored, now time.Time) error {
	var h bytes.Buffer
	if err := s.header.Write(&h); err != nil {
		return err
	}
	body := s.body
	if body == nil {
		body = []byte{}
	}
	return txn.ExecSQL(ctx, t.insert, consumer, id, s.status, h.String(), body, t.at(now))
}

// get reads a stored response in txn, or outside any transaction when txn
// is nil; found is false when there is none.
func (t *table) get(ctx context.Context, txn driver.SQLTxn, consumer, id string) (s stored, found bool, err error) {
	var h string
	query := t.db.QueryRowSQL
	if txn != nil {
		query = txn.QueryRowSQL
	}
	found, err = query(ctx, t.lookup, []any{consumer, id}, &s.status, &h, &s.body)
	if err != nil || !found {
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
	case driver.DialectPostgres:
		q = `DELETE FROM ` + t.name + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + t.name + ` WHERE stored_at < $1 ORDER BY stored_at LIMIT $2 FOR UPDATE SKIP LOCKED))`
	case driver.DialectMySQL:
		q = `DELETE FROM ` + t.name + ` WHERE stored_at < ? ORDER BY stored_at LIMIT ?`
	default:
		q = `DELETE FROM ` + t.name + ` WHERE rowid IN (SELECT rowid FROM ` + t.name + ` WHERE stored_at < ? ORDER BY stored_at LIMIT ?)`
	}
	n, err := t.db.ExecSQL(ctx, q, t.at(before), limit)
	return int(n), err
}
