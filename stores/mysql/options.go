package mysql

import (
	"database/sql"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// Defaults of the options below.
const (
	// DefaultTable is the dedup table's name when WithTable is not given.
	DefaultTable = sqlstore.DefaultTable
	// DefaultRetention is how long claims are kept when WithRetention is
	// not given: seven days.
	DefaultRetention = sqlstore.DefaultRetention
)

// Option configures a Store. Options are checked by Open and New, which
// return an error naming the option when a value is invalid.
type Option func(*config) error

type config struct {
	sqlstore.Config
	claimMode ClaimMode
	isolation sql.IsolationLevel
	logger    *slog.Logger
	maxConns  int // 0: defaultMaxConns()
}

// defaultMaxConns is the pool size of a Store that Open makes: 32, or four
// per CPU where that is more. Leases are rows here, renewed through the
// pool while a transaction holds another connection (the idempotency
// middleware's handler, a leased Consumer's messages), so a pool as small
// as pgxpool's default would make renewals wait behind transactions.
func defaultMaxConns() int { return max(32, 4*runtime.NumCPU()) }

// WithMaxConns bounds the connections of the pool Open makes, idle ones
// kept up to the same number. Default: 32, or four per CPU where that is
// more. Without a bound a leased Consumer, whose messages each take a
// lease transaction, opens as many connections as it holds messages and
// can exhaust the server's max_connections (1040, too many connections)
// for every other client. Give more than the transactions the service
// holds at once (the Consumer's WithConcurrency, the HTTP requests in
// flight under the idempotency middleware), since lease renewals need a
// connection of their own. A Store made with New uses its *sql.DB as
// configured. URL parameter: pool_max_conns=N.
func WithMaxConns(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return c.Fail("WithMaxConns", "must be at least 1, got %d", n)
		}
		c.maxConns = n
		return nil
	}
}

// WithTable sets the dedup table's name. Default: "processed_messages". The
// name must be an SQL identifier: ASCII letters, digits and underscores, not
// starting with a digit, at most 63 characters (the same limit as the other stores, so a name is
// portable).
func WithTable(name string) Option { return func(c *config) error { return c.SetTable(name) } }

// WithRetention sets how long claims are kept before pruning may delete
// them (reported by Retention, compared by the Consumer with the broker's
// redelivery horizon). Default: 7 days. Must be positive.
func WithRetention(d time.Duration) Option { return func(c *config) error { return c.SetRetention(d) } }

// WithClock sets the clock that stamps processed_at on each claim, so tests
// can age rows. Default: time.Now. Must not be nil.
func WithClock(now func() time.Time) Option { return func(c *config) error { return c.SetClock(now) } }

// ClaimMode chooses how Claim learns which ids it inserted.
type ClaimMode int

const (
	// ClaimAuto uses ClaimReturning on MariaDB 10.5 and later and
	// ClaimReadBack elsewhere (MySQL 8 has no INSERT … RETURNING).
	ClaimAuto ClaimMode = iota
	// ClaimReturning claims in one round trip: INSERT … ON DUPLICATE KEY
	// UPDATE … RETURNING (MariaDB 10.5+).
	ClaimReturning
	// ClaimReadBack claims with INSERT … ON DUPLICATE KEY UPDATE, then
	// reads the rows back with a SELECT (two round trips; any MySQL 8 or
	// MariaDB).
	ClaimReadBack
)

// WithClaimMode sets how Claim learns which ids it inserted. Default:
// ClaimAuto (detected from the server version on first use).
func WithClaimMode(m ClaimMode) Option {
	return func(c *config) error {
		if m < ClaimAuto || m > ClaimReadBack {
			return c.Fail("WithClaimMode", "unknown mode %d", m)
		}
		c.claimMode = m
		return nil
	}
}

// WithIsolation sets the isolation level of the transactions Begin starts.
// Default: sql.LevelDefault, the server's (REPEATABLE READ unless
// configured). The claim is correct at READ COMMITTED and above;
// READ COMMITTED takes fewer gap locks, so concurrent batches deadlock less
// often. Only sql.LevelDefault, LevelReadCommitted, LevelRepeatableRead and
// LevelSerializable are accepted.
func WithIsolation(level sql.IsolationLevel) Option {
	return func(c *config) error {
		switch level {
		case sql.LevelDefault, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
			c.isolation = level
			return nil
		}
		return c.Fail("WithIsolation", "%v is not supported (READ UNCOMMITTED would read uncommitted claims)", level)
	}
}

// WithMigrate says whether Open creates the dedup table (Migrate) before
// returning. Default true. Give false to a consumer that runs with least
// privilege (SELECT, INSERT, DELETE on its tables, no DDL) after Migrate
// ran once as the tables' owner, for example from `idemq migrate`: the
// CREATE TABLE IF NOT EXISTS of Migrate needs the CREATE privilege even
// when the table exists. URL parameter: migrate=false.
func WithMigrate(on bool) Option {
	return func(c *config) error { return c.SetMigrate(on) }
}

// WithLogger sets the logger the driver's own lines go to (a connection
// lost mid-read, a bad idle connection closed), each as a warning with the
// line in "line". Default slog.Default(), looked up at each line. It
// applies to the connections Open makes; a Store made with New logs as its
// *sql.DB's connector says. go-sql-driver's process-wide logger
// (mysql.SetLogger) is left alone: each Store's connector has its own.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return c.Fail("WithLogger", "nil logger")
		}
		c.logger = l
		return nil
	}
}

// driverLogger is go-sql-driver's Logger of one Store's connector: it
// turns each line into a structured warning of the Store's logger.
type driverLogger struct{ l *slog.Logger }

func (d driverLogger) Print(v ...any) {
	l := d.l
	if l == nil {
		l = slog.Default()
	}
	l.Warn("idemq mysql: go-sql-driver log", "line", fmt.Sprint(v...))
}

func buildConfig(opts []Option) (config, error) {
	return sqlstore.Build(config{Config: sqlstore.NewConfig("mysql")}, opts)
}
