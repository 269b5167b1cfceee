// Package mysql is idemq's dedup store on MySQL 8 and MariaDB 10.5+
// (database/sql with github.com/go-sql-driver/mysql). Handlers receive the
// store's *sql.Tx and apply their business effect in it, in the same
// transaction that claims the message id.
//
// A claim is one multi-row INSERT … ON DUPLICATE KEY UPDATE
// message_id = message_id per batch: a new id is inserted, a taken id is
// left as it was (and locked), and no duplicate-key error is raised, so
// nothing has to be caught and nothing is hidden the way INSERT IGNORE
// hides truncation and other errors. Each claim call stamps the rows it
// inserts with a random claim_token; reading the token back tells the ids
// this transaction inserted from those that were already there. On
// MariaDB 10.5+ the read-back is the statement's own RETURNING clause (one
// round trip), elsewhere a SELECT (two; a locking one only for rows an
// older REPEATABLE READ snapshot hides).
//
// Ids and consumers are stored as VARBINARY, compared byte for byte: a
// case-insensitive or PAD SPACE collation would make "a", "A" and "a "
// one id.
//
// The table Migrate creates (name from WithTable):
//
//	CREATE TABLE processed_messages (
//	    consumer     VARBINARY(255)  NOT NULL,
//	    message_id   VARBINARY(1024) NOT NULL,
//	    fingerprint  VARBINARY(128)  NOT NULL DEFAULT '',
//	    processed_at DATETIME(6)     NOT NULL,            -- UTC
//	    claim_token  BIGINT          NOT NULL DEFAULT 0,  -- random per Claim call
//	    PRIMARY KEY (consumer, message_id),
//	    KEY idemq_processed_at (processed_at)
//	) ENGINE=InnoDB;
//
// and, for leased claims in progress (Acquire), processed_messages_leases:
// consumer, message_id and fingerprint as above, token BIGINT, acquired_at
// and lease_until DATETIME(6) (UTC), PRIMARY KEY (consumer, message_id),
// KEY idemq_lease_until (lease_until).
//
// Old claims go with Prune (DELETE … ORDER BY processed_at LIMIT n) or
// RunPruner. IsTransient tells the errors worth a retry (deadlock 1213,
// lock wait timeout 1205, killed or lost connection, a server restarting,
// a write refused by a read-only server 1290) from the rest: while a
// server restarts, or a failover makes another one the primary, the
// Consumer retries, database/sql reconnects, and a message whose commit
// landed but whose answer was lost is decided Duplicate on its
// redelivery. As with PostgreSQL, a commit the old primary acknowledged
// and never replicated is gone after a failover, unseen: semi-synchronous
// replication waiting AFTER_SYNC (rpl_semi_sync_master_enabled, with a
// rpl_semi_sync_master_timeout long enough never to fall back to
// asynchronous) is what keeps it.
package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/stores/internal/sqlstore"

	mysqldrv "github.com/go-sql-driver/mysql"
)

// Column limits, checked in Go before any statement: a server in
// non-strict mode would otherwise truncate a long id silently and fold two
// ids into one.
const (
	// MaxConsumerBytes is the longest consumer name, in bytes.
	MaxConsumerBytes = 255
	// MaxIDBytes is the longest message id, in bytes (255 four-byte
	// characters fit).
	MaxIDBytes = 1024
	// MaxFingerprintBytes is the longest fingerprint, in bytes.
	MaxFingerprintBytes = 128
)

// claimChunk bounds the rows of one INSERT so a batch stays far below the
// 65535 placeholders of a prepared statement and max_allowed_packet.
const claimChunk = 1000

// Store is the MySQL/MariaDB dedup store. It implements
// driver.Store[*sql.Tx], admin.Pruner, driver.Retentioner, admin.Migrator
// and driver.Leaser (leased claims: Acquire, Renew, Release), and is safe
// for concurrent use.
//
// The lease methods run in READ COMMITTED transactions of their own:
// SELECT … FOR UPDATE of the lease row, then an INSERT of a new row (a
// duplicate key means a concurrent Acquire inserted it first: it is read
// again) or, for an expired row, an UPDATE with the next token; then, with
// the row locked, a look-up of the dedup table, whose completed claim
// wins. Fence locks the rows with SELECT … FOR UPDATE and deletes those
// whose token still matches (portable to MySQL 8, which has no DELETE …
// RETURNING).
type Store struct {
	sqlstore.Leaser
	db    *sql.DB
	owned bool
	cfg   config

	modeMu sync.Mutex
	mode   ClaimMode // resolved: ClaimReturning or ClaimReadBack, 0 until known
}

var (
	_ sqlstore.Store[*sql.Tx] = (*Store)(nil)
	_ sqlstore.Txn[*sql.Tx]   = (*Txn)(nil)
)

// Open connects to the server at dsn and runs Migrate. dsn is either a
// go-sql-driver DSN ("user:pass@tcp(host:3306)/db") or a URL
// ("mysql://user:pass@host:3306/db?param=value"). Open turns on
// interpolateParams (one round trip per statement instead of
// prepare/execute/close) unless the DSN sets it.
func Open(ctx context.Context, dsn string, opts ...Option) (*Store, error) {
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	dcfg, err := ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql: Open: %w", err)
	}
	if !strings.Contains(dsn, "interpolateParams") {
		dcfg.InterpolateParams = true
	}
	conn, err := mysqldrv.NewConnector(dcfg)
	if err != nil {
		return nil, fmt.Errorf("mysql: Open: %w", err)
	}
	db := sql.OpenDB(conn)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("mysql: Open: %w", err)
	}
	s := newStore(db, cfg)
	s.owned = true
	return sqlstore.Migrated(ctx, &cfg.Config, s, func() { db.Close() })
}

// ParseDSN reads a go-sql-driver DSN or a mysql:// URL into the driver's
// config. Its errors name the part or parameter that is wrong and quote
// none of the DSN, which may hold the password wherever a typo put it.
func ParseDSN(dsn string) (*mysqldrv.Config, error) {
	if scheme, isURL := urlScheme(dsn); isURL {
		if !strings.EqualFold(scheme, "mysql") {
			return nil, errors.New("mysql: the DSN is a URL whose scheme is not mysql://")
		}
		return parseURLDSN("mysql" + dsn[len(scheme):])
	}
	c, err := mysqldrv.ParseDSN(dsn)
	if err != nil {
		return nil, driverDSNError(dsn, err)
	}
	return c, nil
}

// urlScheme reports whether dsn is written as a URL ("scheme://…", or
// "//…" without a scheme) rather than as a go-sql-driver DSN, and its
// scheme as written.
func urlScheme(dsn string) (string, bool) {
	i := strings.Index(dsn, "//")
	if i < 0 {
		return "", false
	}
	if i == 0 {
		return "", true
	}
	scheme, ok := strings.CutSuffix(dsn[:i], ":")
	if !ok || scheme == "" {
		return "", false
	}
	for j, c := range scheme {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || j > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return "", false
		}
	}
	return scheme, true
}

func parseURLDSN(dsn string) (*mysqldrv.Config, error) {
	u, err := redact.ParseURL(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql: DSN: %w", err)
	}
	tlsCfg, rawQuery, err := tlsFromURL(u)
	if err != nil {
		return nil, err
	}
	u.RawQuery = rawQuery
	c := mysqldrv.NewConfig()
	c.Net = "tcp"
	c.Addr = u.Host
	if u.Port() == "" {
		c.Addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	if u.User != nil {
		c.User = u.User.Username()
		c.Passwd, _ = u.User.Password()
	}
	c.DBName = strings.TrimPrefix(u.Path, "/")
	if u.RawQuery == "" {
		c.TLS = tlsCfg
		return c, nil
	}
	// Let the driver read the parameters, so every one it knows works.
	withParams, err := mysqldrv.ParseDSN("/?" + u.RawQuery)
	if err != nil {
		return nil, driverDSNError("/?"+u.RawQuery, err)
	}
	withParams.Net, withParams.Addr = c.Net, c.Addr
	withParams.User, withParams.Passwd, withParams.DBName = c.User, c.Passwd, c.DBName
	if withParams.TLS != nil && !withParams.TLS.InsecureSkipVerify && tlsCfg == nil {
		// The driver set the server name from the placeholder address
		// ("/?…" means 127.0.0.1): verify the URL's host instead.
		withParams.TLS.ServerName = u.Hostname()
	}
	if tlsCfg != nil {
		withParams.TLS = tlsCfg
	}
	return withParams, nil
}

// driverFixed are go-sql-driver's DSN errors that quote nothing.
var driverFixed = []string{
	"invalid DSN: did you forget to escape a param value?",
	"invalid DSN: network address not terminated (missing closing brace)",
	"invalid DSN: missing the slash separating the database name",
	"invalid DSN: interpolateParams can not be used with unsafe collations",
}

// driverDSNError restates an error of go-sql-driver's ParseDSN without the
// values it quotes (a database name or a parameter's value, which a
// misplaced '/' or '@' can fill with the password): it names the
// parameter at fault, found by handing the driver one parameter at a time.
func driverDSNError(dsn string, err error) error {
	msg := err.Error()
	if slices.Contains(driverFixed, msg) {
		return fmt.Errorf("mysql: DSN: %s", msg)
	}
	reason := msg
	if i := strings.IndexAny(reason, ":'\""); i >= 0 {
		reason = strings.TrimSpace(reason[:i])
	}
	if strings.HasPrefix(msg, "invalid dbname") {
		return errors.New("mysql: DSN: the database name has an invalid %-escape (a literal '%' is written %25)")
	}
	if _, query, ok := strings.Cut(dsn[strings.LastIndexByte(dsn, '/')+1:], "?"); ok {
		for pair := range strings.SplitSeq(query, "&") {
			if _, perr := mysqldrv.ParseDSN("/?" + pair); perr != nil {
				name, _, _ := strings.Cut(pair, "=")
				return fmt.Errorf("mysql: DSN parameter %s: %s", redact.Name(name), reason)
			}
		}
	}
	return fmt.Errorf("mysql: DSN: %s", reason)
}

// New wraps an existing database handle opened with the mysql driver. It
// does not migrate: call Migrate. interpolateParams=true in its DSN saves
// two round trips per statement.
func New(db *sql.DB, opts ...Option) (*Store, error) {
	return sqlstore.New("mysql", "*sql.DB", db, opts, buildConfig, newStore)
}

func newStore(db *sql.DB, cfg config) *Store {
	s := &Store{db: db, cfg: cfg}
	s.Leaser = sqlstore.Leaser{Cfg: &s.cfg.Config, Claims: s.claims()}
	return s
}

// DB returns the database handle, for business queries outside a claim.
func (s *Store) DB() *sql.DB { return s.db }

// As implements driver.Store: a **sql.DB target gets the store's pool, and
// **Store the store itself.
func (s *Store) As(target any) bool { return sqlstore.As(target, s.db, s) }

// Ping checks that the database answers, with one round trip.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// Close closes the database handle if Open opened it; a handle given to New
// is left to its owner.
func (s *Store) Close() error { return sqlstore.CloseOwned(s.db, s.owned) }

// Migrate creates the dedup table and the lease table next to it (see
// Acquire) if they do not exist. It is idempotent and safe when several
// processes run it at once: they serialise on a named lock (GET_LOCK), and
// CREATE TABLE IF NOT EXISTS creates each table and its index in one
// statement. A table name too long for its lease table (more than 56
// characters) gets no lease table; Acquire then fails naming WithTable.
func (s *Store) Migrate(ctx context.Context) error {
	wrap := func(err error) error { return s.cfg.Wrap("migrate", err) }
	conn, err := s.db.Conn(ctx) // GET_LOCK belongs to one session
	if err != nil {
		return wrap(err)
	}
	defer conn.Close()
	h := fnv.New64a()
	h.Write([]byte(s.cfg.Table))
	lock := fmt.Sprintf("idemq.migrate.%016x", h.Sum64())
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 30)`, lock).Scan(&got); err != nil {
		return wrap(err)
	}
	if got.Int64 != 1 {
		return wrap(fmt.Errorf("could not take migration lock %s within 30s", lock))
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(?)`, lock)
	t := s.cfg.Table
	_, err = conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (
	consumer     VARBINARY(255)  NOT NULL,
	message_id   VARBINARY(1024) NOT NULL,
	fingerprint  VARBINARY(128)  NOT NULL DEFAULT '',
	processed_at DATETIME(6)     NOT NULL,
	claim_token  BIGINT          NOT NULL DEFAULT 0,
	PRIMARY KEY (consumer, message_id),
	KEY idemq_processed_at (processed_at)
) ENGINE=InnoDB`)
	if err != nil {
		return wrap(err)
	}
	lt, err := s.cfg.LeaseTable()
	if err != nil {
		return nil // a name too long to lease with: Acquire says so
	}
	_, err = conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+lt+` (
	consumer    VARBINARY(255)  NOT NULL,
	message_id  VARBINARY(1024) NOT NULL,
	token       BIGINT          NOT NULL,
	fingerprint VARBINARY(128)  NOT NULL DEFAULT '',
	acquired_at DATETIME(6)     NOT NULL,
	lease_until DATETIME(6)     NOT NULL,
	PRIMARY KEY (consumer, message_id),
	KEY idemq_lease_until (lease_until)
) ENGINE=InnoDB`)
	if err != nil {
		return wrap(err)
	}
	return nil
}

// Prune deletes at most limit claims recorded before the given time (rows
// at or after it are kept), oldest first, in one short statement, and
// returns how many it deleted. Call it again until it returns less than
// limit. Once no such claim is left, it deletes, within the same limit,
// the leases that expired before the given time and before now: never a
// live lease, whatever the time given.
func (s *Store) Prune(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := s.cfg.CheckLimit(limit); err != nil {
		return 0, err
	}
	n, err := sqlstore.ExecCount(ctx, s.db, `DELETE FROM `+s.cfg.Table+
		` WHERE processed_at < ? ORDER BY processed_at LIMIT `+strconv.Itoa(limit), sqlstore.FormatTime(before))
	if err != nil {
		return 0, s.cfg.Wrap("prune", err)
	}
	lt, err := s.cfg.LeaseTable()
	if n == limit || err != nil {
		return n, nil
	}
	m, err := sqlstore.ExecCount(ctx, s.db, `DELETE FROM `+lt+` WHERE lease_until < ? ORDER BY lease_until LIMIT `+strconv.Itoa(limit-n),
		sqlstore.FormatTime(s.cfg.LeaseCut(before)))
	if err := s.claims().SkipNoLeases(err); err != nil {
		return n, s.cfg.Wrap("prune", err)
	}
	return n + m, nil
}

// RunPruner deletes claims older than Retention every interval, in batches
// of batch rows (each its own short statement) until a batch comes back
// short, and logs how many it removed. It returns ctx's error when ctx is
// done; a failed round is logged and retried at the next tick.
func (s *Store) RunPruner(ctx context.Context, every time.Duration, batch int, logger *slog.Logger) error {
	return s.cfg.RunPruner(ctx, s, every, batch, logger)
}

// claimMode resolves ClaimAuto once, from the server's version.
func (s *Store) claimMode(ctx context.Context) (ClaimMode, error) {
	if s.cfg.claimMode != ClaimAuto {
		return s.cfg.claimMode, nil
	}
	s.modeMu.Lock()
	defer s.modeMu.Unlock()
	if s.mode != 0 {
		return s.mode, nil
	}
	var version string
	if err := s.db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
		return 0, fmt.Errorf("mysql: server version: %w", err)
	}
	s.mode = ClaimReadBack
	if supportsReturning(version) {
		s.mode = ClaimReturning
	}
	return s.mode, nil
}

// supportsReturning reports whether a VERSION() string is MariaDB 10.5 or
// later, the first with INSERT … RETURNING.
func supportsReturning(version string) bool {
	if !strings.Contains(version, "MariaDB") {
		return false
	}
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return major > 10 || major == 10 && minor >= 5
}

// Begin starts a transaction at the isolation level of WithIsolation (by
// default the server's, REPEATABLE READ unless configured otherwise; the
// claim needs only READ COMMITTED).
func (s *Store) Begin(ctx context.Context) (driver.Txn[*sql.Tx], error) {
	mode, err := s.claimMode(ctx)
	if err != nil {
		return nil, err
	}
	var opts *sql.TxOptions
	if s.cfg.isolation != sql.LevelDefault {
		opts = &sql.TxOptions{Isolation: s.cfg.isolation}
	}
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("mysql: begin: %w", err)
	}
	return &Txn{s: s, mode: mode, End: sqlstore.End{Store: "mysql", SQL: tx, Gone: connGone, Leases: &s.Leaser}}, nil
}

// Txn is one open dedup transaction of a Store; it implements
// driver.Txn[*sql.Tx]. Like *sql.Tx it is used by one goroutine at a time.
type Txn struct {
	s            *Store
	mode         ClaimMode
	sqlstore.End // the handler's *sql.Tx, savepoints, commit and rollback
}

// Claim claims every id for consumer with one multi-row INSERT … ON
// DUPLICATE KEY UPDATE per 1000 claims, in id order (so batches sharing ids
// lock them in the same order), and reads back each row's claim token and
// fingerprint: the rows carrying this call's token were inserted by it
// (ClaimWon); the others were there already and are ClaimDuplicate, or
// ClaimMismatch when both fingerprints are non-empty and differ.
func (t *Txn) Claim(ctx context.Context, consumer string, claims []driver.Claim) ([]driver.ClaimResult, error) {
	if err := checkClaims("Claim", consumer, claims); err != nil {
		return nil, err
	}
	results := make([]driver.ClaimResult, len(claims))
	if len(claims) == 0 {
		return results, nil
	}
	order := make([]int, len(claims))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(claims[a].ID, claims[b].ID) })
	token := rand.Int64N(1<<63-1) + 1 // never the column default 0
	now := sqlstore.FormatTime(t.s.cfg.Now())
	got := make(map[string]claimedRow, len(claims))
	for chunk := range slices.Chunk(order, claimChunk) {
		var b strings.Builder
		b.WriteString("INSERT INTO " + t.s.cfg.Table + " (consumer, message_id, fingerprint, processed_at, claim_token) VALUES ")
		args := make([]any, 0, 5*len(chunk))
		for j, i := range chunk {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString("(?,?,?,?,?)")
			args = append(args, consumer, claims[i].ID, claims[i].Fingerprint, now, token)
		}
		// A no-op update: the existing row keeps its values (and its
		// token), but is locked, so it cannot vanish before the read-back.
		b.WriteString(" ON DUPLICATE KEY UPDATE message_id = message_id")
		if t.mode == ClaimReturning {
			b.WriteString(" RETURNING message_id, fingerprint, claim_token")
			rows, err := t.End.SQL.QueryContext(ctx, b.String(), args...)
			if err != nil {
				return nil, fmt.Errorf("mysql: claim %d ids for %q: %w", len(chunk), consumer, err)
			}
			if err := scanClaimed(rows, got); err != nil {
				return nil, fmt.Errorf("mysql: claim %d ids for %q: %w", len(chunk), consumer, err)
			}
			continue
		}
		if _, err := t.End.SQL.ExecContext(ctx, b.String(), args...); err != nil {
			return nil, fmt.Errorf("mysql: claim %d ids for %q: %w", len(chunk), consumer, err)
		}
		chunkIDs := make([]string, len(chunk))
		for j, i := range chunk {
			chunkIDs[j] = claims[i].ID
		}
		if err := t.readBack(ctx, consumer, chunkIDs, false, got); err != nil {
			return nil, fmt.Errorf("mysql: claim: read back %d ids for %q: %w", len(chunk), consumer, err)
		}
		// A row committed by another transaction after this one's
		// REPEATABLE READ snapshot was taken is invisible to a plain read;
		// a locking read sees the latest version (and only waits on locks
		// the insert already holds).
		var missing []string
		for _, id := range chunkIDs {
			if _, ok := got[id]; !ok {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			if err := t.readBack(ctx, consumer, missing, true, got); err != nil {
				return nil, fmt.Errorf("mysql: claim: locking read back %d ids for %q: %w", len(missing), consumer, err)
			}
		}
	}
	for i, c := range claims {
		r, ok := got[c.ID]
		switch {
		case !ok:
			return nil, fmt.Errorf("mysql: claim: no row came back for id %q", c.ID)
		case r.token == token:
			results[i] = driver.ClaimWon
		default:
			results[i] = driver.ClassifyStored(c.Fingerprint, r.fp)
		}
	}
	return results, nil
}

// checkClaims checks the column limits of the claims of a call op.
func checkClaims(op, consumer string, claims []driver.Claim) error {
	if consumer == "" {
		return fmt.Errorf("mysql: %s: empty consumer", op)
	}
	if len(consumer) > MaxConsumerBytes {
		return fmt.Errorf("mysql: %s: consumer is %d bytes, at most %d", op, len(consumer), MaxConsumerBytes)
	}
	for _, c := range claims {
		if len(c.ID) > MaxIDBytes {
			return fmt.Errorf("mysql: %s: id %.40q… is %d bytes, at most %d: %w", op, c.ID, len(c.ID), MaxIDBytes, driver.ErrInvalidID)
		}
		if len(c.Fingerprint) > MaxFingerprintBytes {
			return fmt.Errorf("mysql: %s: fingerprint of %q is %d bytes, at most %d", op, c.ID, len(c.Fingerprint), MaxFingerprintBytes)
		}
	}
	return nil
}

// claimedRow is a claimed id's stored fingerprint and claim token.
type claimedRow struct {
	fp    string
	token int64
}

// scanClaimed reads (message_id, fingerprint, claim_token) rows into got
// and closes rows.
func scanClaimed(rows *sql.Rows, got map[string]claimedRow) error {
	defer rows.Close()
	for rows.Next() {
		var id []byte
		var r claimedRow
		if err := rows.Scan(&id, &r.fp, &r.token); err != nil {
			return err
		}
		got[string(id)] = r
	}
	if err := rows.Close(); err != nil {
		return err
	}
	return rows.Err()
}

// readBack reads the claimed rows of ids. The plain read takes no locks
// (a locking read of many keys takes next-key locks and deadlocks with
// concurrent inserts); the locking one is for rows the plain read could
// not see.
func (t *Txn) readBack(ctx context.Context, consumer string, ids []string, locking bool, got map[string]claimedRow) error {
	q, args := t.End.InIDs("SELECT message_id, fingerprint, claim_token FROM "+t.s.cfg.Table+" WHERE consumer = ? AND message_id IN ", consumer, ids)
	if locking {
		q += " FOR UPDATE"
	}
	rows, err := t.End.SQL.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	return scanClaimed(rows, got)
}

// Unclaim deletes this consumer's claims of ids, for messages whose handler
// failed inside a batch transaction.
func (t *Txn) Unclaim(ctx context.Context, consumer string, ids []string) error {
	return t.End.Unclaim(ctx, "DELETE FROM "+t.s.cfg.Table+" WHERE consumer = ? AND message_id IN ", consumer, ids, claimChunk)
}
