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
// older REPEATABLE READ snapshot hides). The RETURNING clause gives back
// two columns per row, message_id and
// CASE WHEN claim_token = <this call's token> THEN NULL ELSE fingerprint END:
// NULL marks a row this call inserted (fingerprint is NOT NULL), and a
// row that was there already brings the stored fingerprint that tells a
// duplicate from a reused id with another body.
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
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strconv"
	"strings"

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
// driver.Store[*sql.Tx], admin.Pruner, driver.Retentioner, admin.Migrator,
// admin.Inspector, admin.Estimator, admin.Lookuper, admin.Forgetter and
// driver.Leaser (leased claims: Acquire, Renew, Release), and is safe for
// concurrent use. Its methods are the shared engine's, Estimate apart;
// this package gives the dialect.
//
// The lease methods run in READ COMMITTED transactions of their own:
// SELECT … FOR UPDATE of the lease row, then an INSERT of a new row (a
// duplicate key means a concurrent Acquire inserted it first: it is read
// again) or, for an expired row, an UPDATE with the next token; then, with
// the row locked, a look-up of the dedup table, whose completed claim
// wins. Fence locks the rows with SELECT … FOR UPDATE and deletes those
// whose token still matches (portable to MySQL 8, which has no DELETE …
// RETURNING). Migrate serialises concurrent runs on a named lock
// (GET_LOCK). Inspect reports the table's size as information_schema
// does (InnoDB's estimate, refreshed by ANALYZE TABLE).
type Store struct {
	*sqlstore.Engine
	cfg config
}

// Txn is one open dedup transaction of a Store; it implements
// driver.Txn[*sql.Tx]. Like *sql.Tx it is used by one goroutine at a time.
type Txn = sqlstore.End

var _ sqlstore.Store[*sql.Tx] = (*Store)(nil)

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
	dcfg.Logger = driverLogger{cfg.logger}
	conn, err := mysqldrv.NewConnector(dcfg)
	if err != nil {
		return nil, fmt.Errorf("mysql: Open: %w", err)
	}
	db := sql.OpenDB(conn)
	n := cmp.Or(cfg.maxConns, defaultMaxConns())
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("mysql: Open: %w", err)
	}
	s := newStore(db, cfg)
	return sqlstore.Opened(ctx, s.Engine, s)
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
	s := &Store{cfg: cfg}
	d := sqlstore.Dialect{
		SQL:         driver.DialectMySQL,
		InsertChunk: claimChunk, ListChunk: claimChunk,
		Tables: func(t string) []string {
			return []string{`CREATE TABLE IF NOT EXISTS ` + t + ` (
	consumer     VARBINARY(255)  NOT NULL,
	message_id   VARBINARY(1024) NOT NULL,
	fingerprint  VARBINARY(128)  NOT NULL DEFAULT '',
	processed_at DATETIME(6)     NOT NULL,
	claim_token  BIGINT          NOT NULL DEFAULT 0,
	PRIMARY KEY (consumer, message_id),
	KEY idemq_processed_at (processed_at)
) ENGINE=InnoDB`}
		},
		LeaseTables: func(lt string) []string {
			return []string{`CREATE TABLE IF NOT EXISTS ` + lt + ` (
	consumer    VARBINARY(255)  NOT NULL,
	message_id  VARBINARY(1024) NOT NULL,
	token       BIGINT          NOT NULL,
	fingerprint VARBINARY(128)  NOT NULL DEFAULT '',
	acquired_at DATETIME(6)     NOT NULL,
	lease_until DATETIME(6)     NOT NULL,
	PRIMARY KEY (consumer, message_id),
	KEY idemq_lease_until (lease_until)
) ENGINE=InnoDB`}
		},
		RunDDL: runDDL,
		Token:  "claim_token",
		// A no-op update: the existing row keeps its values (and its
		// token), but is locked, so it cannot vanish before the read-back.
		OnConflict: " ON DUPLICATE KEY UPDATE message_id = message_id",
		Mode:       s.returning,
		Lock:       " FOR UPDATE",
		// processed_at is written as UTC text; read it back as text too, so
		// the driver's parseTime and loc settings do not matter.
		TimeText: func(expr string) string { return `DATE_FORMAT(` + expr + `, '%Y-%m-%d %H:%i:%s.%f')` },
		DeleteOldest: func(table, col string, limit int) (string, []any) {
			return `DELETE FROM ` + table + ` WHERE ` + col + ` < ? ORDER BY ` + col + ` LIMIT ` + strconv.Itoa(limit), nil
		},
		SizeSQL: `SELECT COALESCE(data_length, 0) + COALESCE(index_length, 0)
FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`,
		LeaseTx: &sql.TxOptions{Isolation: sql.LevelReadCommitted},
		Check:   checkClaims,
		Errors:  serverErrors,
	}
	if cfg.isolation != sql.LevelDefault {
		d.BeginTx = &sql.TxOptions{Isolation: cfg.isolation}
	}
	s.Engine = sqlstore.NewEngine(db, &s.cfg.Config, d)
	return s
}

// As implements driver.Store: a **sql.DB target gets the store's pool, and
// **Store the store itself.
func (s *Store) As(target any) bool { return sqlstore.As(target, s.DB(), s) }

// Ping implements driver.Pinger. Beyond the connection, it asks a Galera
// node whether it is ready (wsrep_ready): a node outside the primary
// component answers pings and SELECT 1 but refuses every statement on a
// table (1047), and the Consumer must see such a store as down, pausing
// deliveries until the node rejoins, instead of counting each handler's
// refused statement as a failed attempt. A server that is not a Galera
// node (no wsrep_on, or wsrep_on OFF) is ready once it answers.
func (s *Store) Ping(ctx context.Context) error {
	show := func(stmt string) (string, error) {
		var name, value string
		err := s.DB().QueryRowContext(ctx, stmt).Scan(&name, &value)
		if errors.Is(err, sql.ErrNoRows) {
			return "", nil
		}
		return value, err
	}
	on, err := show("SHOW VARIABLES LIKE 'wsrep_on'")
	if err != nil || !strings.EqualFold(on, "ON") {
		return err
	}
	ready, err := show("SHOW STATUS LIKE 'wsrep_ready'")
	if err == nil && !strings.EqualFold(ready, "ON") {
		err = &mysqldrv.MySQLError{Number: errUnknownCom, Message: "WSREP has not yet prepared node for application use (wsrep_ready is " + ready + ")"}
	}
	return err
}

// runDDL runs Migrate's statements on one session holding a named lock
// (GET_LOCK), so that processes migrating at once wait for each other;
// CREATE TABLE IF NOT EXISTS creates each table and its index in one
// statement.
func runDDL(ctx context.Context, db *sql.DB, table string, stmts []string) error {
	conn, err := db.Conn(ctx) // GET_LOCK belongs to one session
	if err != nil {
		return err
	}
	defer conn.Close()
	h := fnv.New64a()
	h.Write([]byte(table))
	lock := fmt.Sprintf("idemq.migrate.%016x", h.Sum64())
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 30)`, lock).Scan(&got); err != nil {
		return err
	}
	if got.Int64 != 1 {
		return fmt.Errorf("could not take migration lock %s within 30s", lock)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(?)`, lock)
	for _, stmt := range stmts {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// returning is what Claim's INSERT returns (WithClaimMode); ClaimAuto
// asks the server's version, once.
func (s *Store) returning(ctx context.Context) (sqlstore.Returning, error) {
	mode := s.cfg.claimMode
	if mode == ClaimAuto {
		var version string
		if err := s.DB().QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
			return 0, fmt.Errorf("mysql: server version: %w", err)
		}
		mode = ClaimReadBack
		if supportsReturning(version) {
			mode = ClaimReturning
		}
	}
	if mode == ClaimReturning {
		return sqlstore.ReturnAll, nil
	}
	return sqlstore.ReturnNone, nil
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
