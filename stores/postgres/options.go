package postgres

import (
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
	period    time.Duration // partition period; 0: not partitioned
	noMigrate bool          // WithMigrate(false)
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
// starting with a digit, at most 63 characters. It is resolved through the
// connection's search_path.
func WithTable(name string) Option {
	return func(c *config) {
		if err := validateIdentifier(name); err != nil {
			c.errs = append(c.errs, fmt.Errorf("postgres: WithTable: %w", err))
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
			c.errs = append(c.errs, fmt.Errorf("postgres: WithRetention: must be positive, got %v", d))
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
			c.errs = append(c.errs, errors.New("postgres: WithClock: nil clock"))
			return
		}
		c.now = now
	}
}

// WithPartitions makes the dedup table range-partitioned on processed_at,
// one partition per period (aligned to the Unix epoch in UTC, e.g. 24h
// gives UTC days), so that pruning drops whole partitions instead of
// deleting rows. Default: not partitioned. The period must be a whole
// number of minutes, at least one.
//
// A partitioned table cannot carry a unique key on (consumer, message_id)
// alone (Postgres requires the partition column in it), so in this mode a
// claim first takes a transaction-scoped advisory lock per id, then checks
// every partition and inserts the ids it did not find: concurrent claimers
// of an id still wait for each other. It costs one more round trip per
// batch and one index probe per partition per id.
//
// Upkeep: Migrate and Begin create the partition for the current time and
// the next two periods as needed; DropPartitions (called by RunPruner)
// drops partitions that ended before now minus the retention, so claims
// live between Retention and Retention plus one period. The period of an
// existing table must not change (new partitions would overlap old ones);
// use a new table instead.
func WithPartitions(period time.Duration) Option {
	return func(c *config) {
		if period < time.Minute || period%time.Minute != 0 {
			c.errs = append(c.errs, fmt.Errorf("postgres: WithPartitions: period must be a positive whole number of minutes, got %v", period))
			return
		}
		c.period = period
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
