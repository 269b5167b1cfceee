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
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/internal/sqlstore"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// claimChunk bounds the rows of one INSERT: 2 + 2*400 parameters stays under
// SQLITE_MAX_VARIABLE_NUMBER even on builds that keep the historic 999.
const claimChunk = 400

// Store is the SQLite dedup store. It implements driver.Store[*sql.Tx],
// admin.Pruner, driver.Retentioner, admin.Migrator and driver.Leaser
// (leased claims: Acquire, Renew, Release). It is safe for concurrent use.
//
// Every transaction of a handle from Open takes the write lock at BEGIN,
// the lease methods' own included: Acquire reads the lease row, inserts a
// new one or takes an expired one over with the next token, then reads
// the dedup table, whose completed claim wins. A completion transaction
// that fenced a lease holds the write lock until it ends, so Acquire waits
// for it (up to busy_timeout) and then finds its claim.
type Store struct {
	sqlstore.Leaser
	db    *sql.DB
	owned bool // Close closes db only when Open created it
	cfg   config
	q     queries
}

var (
	_ sqlstore.Store[*sql.Tx] = (*Store)(nil)
	_ sqlstore.Txn[*sql.Tx]   = (*Txn)(nil)
)

type queries struct {
	migrate       []string
	migrateLeases func(leaseTable string) []string
	unclaim       string
	prune         string
}

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
	s.owned = true
	return sqlstore.Migrated(ctx, &cfg.Config, s, func() { db.Close() })
}

// New wraps an existing database handle opened with the "sqlite" driver.
// It does not migrate: call Migrate. For claimers of the same id to wait
// for each other instead of failing with SQLITE_BUSY, the handle should be
// opened with a busy_timeout and _txlock=immediate, as Open does.
func New(db *sql.DB, opts ...Option) (*Store, error) {
	return sqlstore.New("sqlite", "*sql.DB", db, opts, buildConfig, newStore)
}

func newStore(db *sql.DB, cfg config) *Store {
	t := cfg.Table // validated: safe to splice into SQL
	s := &Store{db: db, cfg: cfg, q: queries{
		migrate: []string{
			`CREATE TABLE IF NOT EXISTS ` + t + ` (
	consumer     TEXT NOT NULL,
	message_id   TEXT NOT NULL,
	fingerprint  TEXT NOT NULL DEFAULT '',
	processed_at TEXT NOT NULL,
	PRIMARY KEY (consumer, message_id)
)`,
			`CREATE INDEX IF NOT EXISTS ` + t + `_processed_at_idx ON ` + t + ` (processed_at)`,
		},
		// A name too long to lease with gets no lease table: Acquire says so.
		migrateLeases: func(lt string) []string {
			return []string{`CREATE TABLE IF NOT EXISTS ` + lt + ` (
	consumer    TEXT    NOT NULL,
	message_id  TEXT    NOT NULL,
	token       INTEGER NOT NULL,
	fingerprint TEXT    NOT NULL DEFAULT '',
	acquired_at TEXT    NOT NULL,
	lease_until TEXT    NOT NULL,
	PRIMARY KEY (consumer, message_id)
)`,
				`CREATE INDEX IF NOT EXISTS ` + lt + `_lease_until_idx ON ` + lt + ` (lease_until)`,
			}
		},
		unclaim: `DELETE FROM ` + t + ` WHERE consumer = ?1 AND message_id IN `,
		prune: `DELETE FROM ` + t + ` WHERE rowid IN (SELECT rowid FROM ` + t +
			` WHERE processed_at < ?1 ORDER BY processed_at LIMIT ?2)`,
	}}
	s.Leaser = sqlstore.Leaser{Cfg: &s.cfg.Config, Claims: s.claims()}
	return s
}

// DB returns the underlying database handle, for business tables and
// queries outside a claim.
func (s *Store) DB() *sql.DB { return s.db }

// As implements driver.Store: a **sql.DB target gets the store's pool, and
// **Store the store itself.
func (s *Store) As(target any) bool { return sqlstore.As(target, s.db, s) }

// Ping checks that the database answers, with one round trip.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// Close closes the database if Open opened it; a handle given to New is
// left to its owner.
func (s *Store) Close() error { return sqlstore.CloseOwned(s.db, s.owned) }

// Migrate creates the dedup table and its processed_at index, and the
// lease table next to it (see Acquire), if they do not exist. It is
// idempotent. A table name too long for its lease table (more than 56
// characters) gets no lease table; Acquire then fails naming WithTable.
func (s *Store) Migrate(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.cfg.Wrap("migrate", err)
	}
	defer tx.Rollback()
	stmts := s.q.migrate
	if lt, err := s.cfg.LeaseTable(); err == nil {
		stmts = append(slices.Clip(stmts), s.q.migrateLeases(lt)...)
	}
	for _, stmt := range stmts {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return s.cfg.Wrap("migrate", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return s.cfg.Wrap("migrate", fmt.Errorf("commit: %w", err))
	}
	return nil
}

// Prune deletes at most limit claims recorded before the given time (rows
// at or after it are kept), oldest first, in one short transaction, and
// returns how many it deleted. Call it again until it returns less than
// limit. Once no such claim is left, it deletes, within the same limit,
// the leases that expired before the given time and before now: never a
// live lease, whatever the time given.
func (s *Store) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := s.cfg.CheckLimit(limit); err != nil {
		return 0, err
	}
	n, err := sqlstore.ExecCount(ctx, s.db, s.q.prune, sqlstore.FormatTime(before), limit)
	if err != nil {
		return 0, s.cfg.Wrap("prune", err)
	}
	lt, err := s.cfg.LeaseTable()
	if n == limit || err != nil {
		return n, nil
	}
	m, err := sqlstore.ExecCount(ctx, s.db, `DELETE FROM `+lt+` WHERE rowid IN (SELECT rowid FROM `+lt+
		` WHERE lease_until < ?1 ORDER BY lease_until LIMIT ?2)`, sqlstore.FormatTime(s.cfg.LeaseCut(before)), limit-n)
	if err := s.claims().SkipNoLeases(err); err != nil {
		return n, s.cfg.Wrap("prune", err)
	}
	return n + m, nil
}

// RunPruner deletes claims older than Retention every interval, in batches
// of batch rows (each its own short transaction) until a batch comes back
// short, and logs how many it removed. It returns ctx's error when ctx is
// done; a failed round is logged and retried at the next tick.
func (s *Store) RunPruner(ctx context.Context, every time.Duration, batch int, logger *slog.Logger) error {
	return s.cfg.RunPruner(ctx, s, every, batch, logger)
}

// Begin starts a transaction. With a handle from Open it takes the write
// lock at once, waiting up to busy_timeout while another transaction holds
// it.
func (s *Store) Begin(ctx context.Context) (driver.Txn[*sql.Tx], error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("sqlite: begin: %w", err)
	}
	return &Txn{s: s, End: sqlstore.End{Store: "sqlite", SQL: tx, Numbered: true, Leases: &s.Leaser}}, nil
}

// Txn is one open dedup transaction of a Store; it implements
// driver.Txn[*sql.Tx]. Like *sql.Tx it is used by one goroutine at a time.
type Txn struct {
	s            *Store
	sqlstore.End // the handler's *sql.Tx, savepoints, commit and rollback
}

// Claim inserts (consumer, id) for every claim in one multi-row INSERT … ON
// CONFLICT DO NOTHING RETURNING statement (split every 400 claims for
// SQLite's parameter limit). Ids that were not inserted already exist: one
// SELECT of their stored fingerprints tells ClaimDuplicate from
// ClaimMismatch (both fingerprints non-empty and different).
func (t *Txn) Claim(ctx context.Context, consumer string, claims []driver.Claim) ([]driver.ClaimResult, error) {
	if consumer == "" {
		return nil, errors.New("sqlite: Claim: empty consumer")
	}
	results := make([]driver.ClaimResult, len(claims))
	if len(claims) == 0 {
		return results, nil
	}
	now := sqlstore.FormatTime(t.s.cfg.Now())
	won := make(map[string]bool, len(claims))
	for chunk := range slices.Chunk(claims, claimChunk) {
		var b strings.Builder
		b.WriteString("INSERT INTO " + t.s.cfg.Table + " (consumer, processed_at, message_id, fingerprint) VALUES ")
		args := make([]any, 0, 2+2*len(chunk))
		args = append(args, consumer, now)
		for i, c := range chunk {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "(?1,?2,?%d,?%d)", 3+2*i, 4+2*i)
			args = append(args, c.ID, c.Fingerprint)
		}
		b.WriteString(" ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id")
		if err := collectIDs(ctx, t.End.SQL, b.String(), args, func(id string) { won[id] = true }); err != nil {
			return nil, fmt.Errorf("sqlite: claim: %w", err)
		}
	}
	var lost []string
	for i, c := range claims {
		if won[c.ID] {
			results[i] = driver.ClaimWon
		} else {
			lost = append(lost, c.ID)
		}
	}
	if len(lost) == 0 {
		return results, nil
	}
	stored := make(map[string]string, len(lost))
	for chunk := range slices.Chunk(lost, 2*claimChunk) {
		q, args := t.End.InIDs("SELECT message_id, fingerprint FROM "+t.s.cfg.Table+" WHERE consumer = ?1 AND message_id IN ", consumer, chunk)
		rows, err := t.End.SQL.QueryContext(ctx, q, args...)
		if err != nil {
			return nil, fmt.Errorf("sqlite: claim: read fingerprints: %w", err)
		}
		for rows.Next() {
			var id, fp string
			if err := rows.Scan(&id, &fp); err != nil {
				rows.Close()
				return nil, fmt.Errorf("sqlite: claim: read fingerprints: %w", err)
			}
			stored[id] = fp
		}
		if err := rows.Close(); err != nil {
			return nil, fmt.Errorf("sqlite: claim: read fingerprints: %w", err)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("sqlite: claim: read fingerprints: %w", err)
		}
	}
	for i, c := range claims {
		if results[i] != 0 {
			continue
		}
		fp, ok := stored[c.ID]
		if !ok {
			// The write lock is held from BEGIN, so a row that made the
			// insert lose cannot vanish before this read.
			return nil, fmt.Errorf("sqlite: claim: id %q lost the insert but has no row", c.ID)
		}
		results[i] = driver.ClassifyStored(c.Fingerprint, fp)
	}
	return results, nil
}

func collectIDs(ctx context.Context, tx *sql.Tx, query string, args []any, f func(string)) error {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		f(id)
	}
	if err := rows.Close(); err != nil {
		return err
	}
	return rows.Err()
}

// Unclaim deletes this consumer's claims of ids, for messages whose handler
// failed inside a batch transaction.
func (t *Txn) Unclaim(ctx context.Context, consumer string, ids []string) error {
	return t.End.Unclaim(ctx, t.s.q.unclaim, consumer, ids, 2*claimChunk)
}
