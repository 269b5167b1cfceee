package postgres

import (
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
	period time.Duration // partition period; 0: not partitioned
}

// WithTable sets the dedup table's name. Default: "processed_messages". The
// name must be an SQL identifier: ASCII letters, digits and underscores, not
// starting with a digit, at most 63 characters. It is resolved through the
// connection's search_path.
func WithTable(name string) Option { return func(c *config) error { return c.SetTable(name) } }

// WithRetention sets how long claims are kept before pruning may delete
// them (reported by Retention, compared by the Consumer with the broker's
// redelivery horizon). Default: 7 days. Must be positive.
func WithRetention(d time.Duration) Option { return func(c *config) error { return c.SetRetention(d) } }

// WithClock sets the clock that stamps processed_at on each claim, so tests
// can age rows. Default: time.Now. Must not be nil.
func WithClock(now func() time.Time) Option { return func(c *config) error { return c.SetClock(now) } }

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
	return func(c *config) error {
		if period < time.Minute || period%time.Minute != 0 {
			return c.Fail("WithPartitions", "period must be a positive whole number of minutes, got %v", period)
		}
		c.period = period
		return nil
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

func buildConfig(opts []Option) (config, error) {
	return sqlstore.Build(config{Config: sqlstore.NewConfig("postgres")}, opts)
}

// Table returns the dedup table's name (WithTable).
func (s *Store) Table() string { return s.cfg.Table }

// Retention returns how long claims are kept (WithRetention).
func (s *Store) Retention() time.Duration { return s.cfg.Retention }
