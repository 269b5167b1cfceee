package mysql

import (
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Defaults of the options below.
const (
	// DefaultTable is the dedup table's name when WithTable is not given.
	DefaultTable = "processed_messages"
	// DefaultRetention is how long claims are kept when WithRetention is
	// not given: seven days.
	DefaultRetention = 7 * 24 * time.Hour
)

// Option configures a Store. Options are checked by Open and New, which
// return an error naming the option when a value is invalid.
type Option func(*config)

type config struct {
	table     string
	retention time.Duration
	now       func() time.Time
	claimMode ClaimMode
	isolation sql.IsolationLevel
	noMigrate bool // WithMigrate(false)
	errs      []error
}

func buildConfig(opts []Option) (config, error) {
	c := config{table: DefaultTable, retention: DefaultRetention, now: time.Now}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c, errors.Join(c.errs...)
}

// WithTable sets the dedup table's name. Default: "processed_messages". The
// name must be an SQL identifier: ASCII letters, digits and underscores, not
// starting with a digit, at most 63 characters (the same limit as the other stores, so a name is
// portable).
func WithTable(name string) Option {
	return func(c *config) {
		if err := validateIdentifier(name); err != nil {
			c.errs = append(c.errs, fmt.Errorf("mysql: WithTable: %w", err))
			return
		}
		c.table = name
	}
}

// WithRetention sets how long claims are kept before pruning may delete
// them (reported by Retention, compared by the Consumer with the broker's
// redelivery horizon). Default: 7 days. Must be positive.
func WithRetention(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("mysql: WithRetention: must be positive, got %v", d))
			return
		}
		c.retention = d
	}
}

// WithClock sets the clock that stamps processed_at on each claim, so tests
// can age rows. Default: time.Now. Must not be nil.
func WithClock(now func() time.Time) Option {
	return func(c *config) {
		if now == nil {
			c.errs = append(c.errs, errors.New("mysql: WithClock: nil clock"))
			return
		}
		c.now = now
	}
}

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
	return func(c *config) {
		if m < ClaimAuto || m > ClaimReadBack {
			c.errs = append(c.errs, fmt.Errorf("mysql: WithClaimMode: unknown mode %d", m))
			return
		}
		c.claimMode = m
	}
}

// WithIsolation sets the isolation level of the transactions Begin starts.
// Default: sql.LevelDefault, the server's (REPEATABLE READ unless
// configured). The claim is correct at READ COMMITTED and above;
// READ COMMITTED takes fewer gap locks, so concurrent batches deadlock less
// often. Only sql.LevelDefault, LevelReadCommitted, LevelRepeatableRead and
// LevelSerializable are accepted.
func WithIsolation(level sql.IsolationLevel) Option {
	return func(c *config) {
		switch level {
		case sql.LevelDefault, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
			c.isolation = level
		default:
			c.errs = append(c.errs, fmt.Errorf("mysql: WithIsolation: %v is not supported (READ UNCOMMITTED would read uncommitted claims)", level))
		}
	}
}

const maxIdentifierLength = 63

// validateIdentifier accepts ASCII letters, digits and underscores, not
// starting with a digit, 1 to 63 characters: table names are spliced into
// SQL text, so nothing that could need quoting is allowed.
func validateIdentifier(name string) error {
	if name == "" {
		return errors.New("empty table name")
	}
	if len(name) > maxIdentifierLength {
		return fmt.Errorf("table name is %d characters long, at most %d allowed", len(name), maxIdentifierLength)
	}
	for i := 0; i < len(name); i++ {
		ch := name[i]
		switch {
		case ch == '_', ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z':
		case ch >= '0' && ch <= '9':
			if i == 0 {
				return errors.New("table name starts with a digit")
			}
		default:
			return fmt.Errorf("table name holds %q: only letters, digits and underscores are allowed", ch)
		}
	}
	return nil
}

// WithMigrate says whether Open creates the dedup table (Migrate) before
// returning. Default true. Give false to a consumer that runs with least
// privilege (SELECT, INSERT, DELETE on its tables, no DDL) after Migrate
// ran once as the tables' owner, for example from `idemq migrate`: the
// CREATE TABLE IF NOT EXISTS of Migrate needs the CREATE privilege even
// when the table exists. URL parameter: migrate=false.
func WithMigrate(on bool) Option {
	return func(c *config) { c.noMigrate = !on }
}
