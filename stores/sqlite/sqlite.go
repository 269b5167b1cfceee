// Package sqlite is idemq's embedded dedup store on SQLite (modernc.org/sqlite,
// pure Go, no cgo). Handlers receive the store's *sql.Tx and apply their
// business effect in it, in the same transaction that claims the message id.
//
// Open configures the database so that every transaction takes SQLite's
// write lock at BEGIN (_txlock=immediate) and waits busy_timeout for it:
// two transactions claiming the same id therefore run one after the other,
// the second seeing the first one's committed claim (ClaimDuplicate) or,
// if it rolled back, winning the claim itself. WAL mode lets readers run
// beside the writer.
//
// The table Migrate creates (name from WithTable):
//
//	CREATE TABLE processed_messages (
//	    consumer     TEXT NOT NULL,
//	    message_id   TEXT NOT NULL,
//	    fingerprint  TEXT NOT NULL DEFAULT '',
//	    processed_at TEXT NOT NULL,  -- UTC, "2006-01-02 15:04:05.000000"
//	    PRIMARY KEY (consumer, message_id)
//	);
//	CREATE INDEX processed_messages_processed_at_idx ON processed_messages (processed_at);
//
// and, for leased claims in progress (Acquire), processed_messages_leases:
// consumer, message_id, token INTEGER, fingerprint, acquired_at and
// lease_until (TEXT, UTC as processed_at), PRIMARY KEY (consumer,
// message_id), an index on lease_until.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/internal/sqlstore"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// claimChunk bounds the rows of one INSERT: 2 + 2*400 parameters stays under
// SQLITE_MAX_VARIABLE_NUMBER even on builds that keep the historic 999.
const claimChunk = 400

// Store is the SQLite dedup store. It implements driver.Store[*sql.Tx],
// admin.Pruner, driver.Retentioner, admin.Migrator, admin.Inspector,
// admin.Estimator, admin.Lookuper, admin.Forgetter and driver.Leaser
// (leased claims: Acquire, Renew, Release). It is safe for concurrent
// use. Its methods are the shared engine's, Estimate apart; this package
// gives the dialect.
//
// Every transaction of a handle from Open takes the write lock at BEGIN,
// the lease methods' own included: Acquire reads the lease row, inserts a
// new one or takes an expired one over with the next token, then reads
// the dedup table, whose completed claim wins. A completion transaction
// that fenced a lease holds the write lock until it ends, so Acquire waits
// for it (up to busy_timeout) and then finds its claim; the rows it reads
// need no lock of their own. A claim's INSERT … ON CONFLICT DO NOTHING
// RETURNING names the ids it inserted, and one SELECT reads the stored
// fingerprints of the others. Inspect takes the table's size from the
// dbstat table (0 when the SQLite build lacks it).
type Store struct {
	*sqlstore.Engine
	cfg config
}

// Txn is one open dedup transaction of a Store; it implements
// driver.Txn[*sql.Tx]. Like *sql.Tx it is used by one goroutine at a time.
type Txn = sqlstore.End

var _ sqlstore.Store[*sql.Tx] = (*Store)(nil)

// Open opens (creating if needed) the SQLite database file at path in WAL
// mode, with busy_timeout (WithBusyTimeout) and write-locking transactions,
// and runs Migrate. The path is a file name; it must not hold '?'.
func Open(ctx context.Context, path string, opts ...Option) (*Store, error) {
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	if path == "" {
		return nil, errors.New("sqlite: Open: empty path")
	}
	if path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil, fmt.Errorf("sqlite: Open: path %q: give a file name; an in-memory database would be private to each pooled connection (use New with a handle of your own for special DSNs)", path)
	}
	if strings.ContainsRune(path, '?') {
		return nil, errors.New("sqlite: Open: the path holds '?', which would be read as DSN parameters")
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", cfg.busyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	// Take the write lock at BEGIN: a deferred transaction that reads and
	// then writes can fail with SQLITE_BUSY without waiting, an immediate
	// one waits busy_timeout for the lock.
	q.Add("_txlock", "immediate")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlite: Open %q: %w", path, err)
	}
	s := newStore(db, cfg)
	return sqlstore.Opened(ctx, s.Engine, s)
}

// New wraps an existing database handle opened with the "sqlite" driver.
// It does not migrate: call Migrate. For claimers of the same id to wait
// for each other instead of failing with SQLITE_BUSY, the handle should be
// opened with a busy_timeout and _txlock=immediate, as Open does.
func New(db *sql.DB, opts ...Option) (*Store, error) {
	return sqlstore.New("sqlite", "*sql.DB", db, opts, buildConfig, newStore)
}

func newStore(db *sql.DB, cfg config) *Store {
	s := &Store{cfg: cfg}
	s.Engine = sqlstore.NewEngine(db, &s.cfg.Config, sqlstore.Dialect{
		SQL:      driver.DialectSQLite,
		Numbered: true, InsertChunk: claimChunk, ListChunk: 2 * claimChunk,
		Tables: func(t string) []string {
			return []string{`CREATE TABLE IF NOT EXISTS ` + t + ` (
	consumer     TEXT NOT NULL,
	message_id   TEXT NOT NULL,
	fingerprint  TEXT NOT NULL DEFAULT '',
	processed_at TEXT NOT NULL,
	PRIMARY KEY (consumer, message_id)
)`,
				`CREATE INDEX IF NOT EXISTS ` + t + `_processed_at_idx ON ` + t + ` (processed_at)`}
		},
		LeaseTables: func(lt string) []string {
			return []string{`CREATE TABLE IF NOT EXISTS ` + lt + ` (
	consumer    TEXT    NOT NULL,
	message_id  TEXT    NOT NULL,
	token       INTEGER NOT NULL,
	fingerprint TEXT    NOT NULL DEFAULT '',
	acquired_at TEXT    NOT NULL,
	lease_until TEXT    NOT NULL,
	PRIMARY KEY (consumer, message_id)
)`,
				`CREATE INDEX IF NOT EXISTS ` + lt + `_lease_until_idx ON ` + lt + ` (lease_until)`}
		},
		OnConflict: " ON CONFLICT (consumer, message_id) DO NOTHING",
		Returning:  sqlstore.ReturnInserted,
		DeleteOldest: func(table, col string, limit int) (string, []any) {
			return `DELETE FROM ` + table + ` WHERE rowid IN (SELECT rowid FROM ` + table +
				` WHERE ` + col + ` < ?1 ORDER BY ` + col + ` LIMIT ?2)`, []any{limit}
		},
		// dbstat is an optional virtual table: without it the size is
		// unknown (0), which TableStats allows, rather than an error.
		SizeSQL:      `SELECT sum(pgsize) FROM dbstat WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = ?1)`,
		SizeOptional: true,
		Errors:       engineErrors,
	})
	return s
}

// As implements driver.Store: a **sql.DB target gets the store's pool, and
// **Store the store itself.
func (s *Store) As(target any) bool { return sqlstore.As(target, s.DB(), s) }
