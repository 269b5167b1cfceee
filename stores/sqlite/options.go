package sqlite

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
	// not given: seven days, longer than any broker's usual redelivery
	// horizon.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultBusyTimeout is how long a connection opened by Open waits for
	// another transaction's write lock before failing with SQLITE_BUSY.
	DefaultBusyTimeout = 5 * time.Second
)

// Option configures a Store. Options are checked by Open and New, which
// return an error naming the option when a value is invalid.
type Option func(*config)

type config struct {
	table       string
	retention   time.Duration
	now         func() time.Time
	busyTimeout time.Duration
	errs        []error
}

func defaultConfig() config {
	return config{
		table:       DefaultTable,
		retention:   DefaultRetention,
		now:         time.Now,
		busyTimeout: DefaultBusyTimeout,
	}
}

// WithTable sets the dedup table's name. Default: "processed_messages". The
// name must be an SQL identifier: ASCII letters, digits and underscores, not
// starting with a digit, at most 63 characters (it is spliced into SQL, so
// nothing else is accepted).
func WithTable(name string) Option {
	return func(c *config) {
		if err := ValidateIdentifier(name); err != nil {
			c.errs = append(c.errs, fmt.Errorf("sqlite: WithTable: %w", err))
			return
		}
		c.table = name
	}
}

// WithRetention sets how long claims are kept before Prune may delete them
// (reported by Retention, compared by the Consumer with the broker's
// redelivery horizon). Default: 7 days. Must be positive.
func WithRetention(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("sqlite: WithRetention: must be positive, got %v", d))
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
			c.errs = append(c.errs, errors.New("sqlite: WithClock: nil clock"))
			return
		}
		c.now = now
	}
}

// WithBusyTimeout sets how long a connection opened by Open waits for the
// write lock held by another transaction (busy_timeout) before failing.
// Claimers of the same id serialise on this lock, so it must outlast the
// longest transaction. Default: 5s. Ignored by New, whose caller configures
// its own database handle. Must be positive.
func WithBusyTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("sqlite: WithBusyTimeout: must be positive, got %v", d))
			return
		}
		c.busyTimeout = d
	}
}

func buildConfig(opts []Option) (config, error) {
	c := defaultConfig()
	for _, o := range opts {
		if o == nil {
			continue
		}
		o(&c)
	}
	return c, errors.Join(c.errs...)
}

// MaxIdentifierLength is the longest table name WithTable accepts (the
// Postgres limit, kept the same in every store so a name is portable).
const MaxIdentifierLength = 63

// ValidateIdentifier reports whether name can be used as a table name:
// ASCII letters, digits and underscores, not starting with a digit, 1 to 63
// characters. Table names are spliced into SQL text, so this is the only
// thing standing between a configuration value and SQL injection.
func ValidateIdentifier(name string) error {
	if name == "" {
		return errors.New("empty table name")
	}
	if len(name) > MaxIdentifierLength {
		return fmt.Errorf("table name is %d characters long, at most %d allowed", len(name), MaxIdentifierLength)
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
