package sqlite

import (
	"time"

	"github.com/idemq/idemq/internal/sqlident"
	"github.com/idemq/idemq/stores/internal/sqlstore"
)

// Defaults of the options below.
const (
	// DefaultTable is the dedup table's name when WithTable is not given.
	DefaultTable = sqlstore.DefaultTable
	// DefaultRetention is how long claims are kept when WithRetention is
	// not given: seven days, longer than any broker's usual redelivery
	// horizon.
	DefaultRetention = sqlstore.DefaultRetention
	// DefaultBusyTimeout is how long a connection opened by Open waits for
	// another transaction's write lock before failing with SQLITE_BUSY.
	DefaultBusyTimeout = 5 * time.Second
)

// Option configures a Store. Options are checked by Open and New, which
// return an error naming the option when a value is invalid.
type Option func(*config) error

type config struct {
	sqlstore.Config
	busyTimeout time.Duration
}

// WithTable sets the dedup table's name. Default: "processed_messages". The
// name must be an SQL identifier: ASCII letters, digits and underscores, not
// starting with a digit, at most 63 characters (it is spliced into SQL, so
// nothing else is accepted).
func WithTable(name string) Option { return func(c *config) error { return c.SetTable(name) } }

// WithRetention sets how long claims are kept before Prune may delete them
// (reported by Retention, compared by the Consumer with the broker's
// redelivery horizon). Default: 7 days. Must be positive.
func WithRetention(d time.Duration) Option { return func(c *config) error { return c.SetRetention(d) } }

// WithClock sets the clock that stamps processed_at on each claim, so tests
// can age rows. Default: time.Now. Must not be nil.
func WithClock(now func() time.Time) Option { return func(c *config) error { return c.SetClock(now) } }

// WithBusyTimeout sets how long a connection opened by Open waits for the
// write lock held by another transaction (busy_timeout) before failing.
// Claimers of the same id serialise on this lock, so it must outlast the
// longest transaction. Default: 5s. Ignored by New, whose caller configures
// its own database handle. Must be positive.
func WithBusyTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return c.Fail("WithBusyTimeout", "must be positive, got %v", d)
		}
		c.busyTimeout = d
		return nil
	}
}

// MaxIdentifierLength is the longest table name WithTable accepts (the
// Postgres limit, kept the same in every store so a name is portable).
const MaxIdentifierLength = sqlident.MaxLength

// ValidateIdentifier reports whether name can be used as a table name:
// ASCII letters, digits and underscores, not starting with a digit, 1 to 63
// characters. Table names are spliced into SQL text, so this is the only
// thing standing between a configuration value and SQL injection.
func ValidateIdentifier(name string) error { return sqlident.Check(name) }

func buildConfig(opts []Option) (config, error) {
	return sqlstore.Build(config{Config: sqlstore.NewConfig("sqlite"), busyTimeout: DefaultBusyTimeout}, opts)
}
