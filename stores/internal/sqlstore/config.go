package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/internal/sqlident"
)

// Defaults every store shares.
const (
	// DefaultTable is the dedup table's name when WithTable is not given.
	DefaultTable = "processed_messages"
	// DefaultRetention is how long claims are kept when WithRetention is
	// not given: seven days, longer than any broker's usual redelivery
	// horizon.
	DefaultRetention = 7 * 24 * time.Hour
)

// Config is the part of a store's configuration every store has. A store's
// own config embeds it, and its options call the setters, so the
// validation and the error wording are the same in every store.
type Config struct {
	// Store is the store's name ("postgres"), the prefix of its errors.
	Store string
	// Table is the dedup table's name, checked by SetTable: safe to splice
	// into SQL.
	Table string
	// Retention is how long claims are kept.
	Retention time.Duration
	// Now stamps processed_at on claims.
	Now func() time.Time
	// NoMigrate is WithMigrate(false): Open does not create the table.
	NoMigrate bool
}

// NewConfig returns the defaults of the store named store.
func NewConfig(store string) Config {
	return Config{Store: store, Table: DefaultTable, Retention: DefaultRetention, Now: time.Now}
}

// Build runs the non-nil opts, in order, on c, a store's config with its
// defaults, and returns it with every invalid option's error joined.
func Build[C any, O ~func(*C) error](c C, opts []O) (C, error) {
	return c, option.ApplyAll(&c, opts...)
}

// Fail returns the error of an option given an invalid value:
// "store: option: reason".
func (c *Config) Fail(option, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %s", c.Store, option, fmt.Sprintf(format, args...))
}

// SetTable is WithTable: name must pass sqlident.Check.
func (c *Config) SetTable(name string) error {
	if err := sqlident.Check(name); err != nil {
		return fmt.Errorf("%s: WithTable: %w", c.Store, err)
	}
	c.Table = name
	return nil
}

// SetRetention is WithRetention: d must be positive.
func (c *Config) SetRetention(d time.Duration) error {
	if d <= 0 {
		return c.Fail("WithRetention", "must be positive, got %v", d)
	}
	c.Retention = d
	return nil
}

// SetClock is WithClock: now must not be nil.
func (c *Config) SetClock(now func() time.Time) error {
	if now == nil {
		return c.Fail("WithClock", "nil clock")
	}
	c.Now = now
	return nil
}

// SetMigrate is WithMigrate: whether Open creates the table.
func (c *Config) SetMigrate(on bool) error {
	c.NoMigrate = !on
	return nil
}

// Wrap prefixes err with the store, the operation and the table:
// "mysql: prune processed_messages: …".
func (c *Config) Wrap(op string, err error) error {
	return fmt.Errorf("%s: %s %s: %w", c.Store, op, c.Table, err)
}

// CheckLimit is the check of a Prune call's limit, which must be positive.
func (c *Config) CheckLimit(limit int) error {
	if limit <= 0 {
		return fmt.Errorf("%s: Prune: limit must be positive, got %d", c.Store, limit)
	}
	return nil
}

// RunPruner is a store's RunPruner: RunPruner on p with the store's clock,
// retention and table.
func (c *Config) RunPruner(ctx context.Context, p admin.Pruner, every time.Duration, batch int, logger *slog.Logger) error {
	return RunPruner(ctx, p, PruneSchedule{Every: every, Batch: batch, Retention: c.Retention, Now: c.Now, Logger: logger, Table: c.Table})
}

// Migrated ends a store's Open: unless NoMigrate is set it runs s's
// Migrate, and when that fails closes the handle Open opened (with
// closeHandle) and returns the error.
func Migrated[S admin.Migrator](ctx context.Context, c *Config, s S, closeHandle func()) (S, error) {
	if !c.NoMigrate {
		if err := s.Migrate(ctx); err != nil {
			closeHandle()
			var none S
			return none, err
		}
	}
	return s, nil
}

// New is every store's New: it refuses a nil handle h (what names its
// type in the error), builds the config from opts with build, and returns
// newStore on h with it.
func New[H comparable, O, C, S any](store, what string, h H, opts []O, build func([]O) (C, error), newStore func(H, C) S) (S, error) {
	var none S
	var nilHandle H
	if h == nilHandle {
		return none, fmt.Errorf("%s: New: nil %s", store, what)
	}
	cfg, err := build(opts)
	if err != nil {
		return none, err
	}
	return newStore(h, cfg), nil
}

// PruneSchedule says how RunPruner deletes old claims from a store.
type PruneSchedule struct {
	// Every is how often a round starts. Required.
	Every time.Duration
	// Batch is how many rows one Prune call deletes at most. Required.
	Batch int
	// Retention is how long claims are kept: a round deletes those
	// recorded before now minus Retention. Required.
	Retention time.Duration
	// Now returns the current time. Default time.Now.
	Now func() time.Time
	// Logger receives a line per round that deleted rows, and failures.
	// Default slog.Default().
	Logger *slog.Logger
	// Table names the dedup table in log lines.
	Table string
	// Duty paces each round's batches (admin.PruneOptions.Duty). Default
	// admin.DefaultPruneDuty.
	Duty float64
}

// RunPruner deletes claims older than s.Retention every s.Every: each round
// is one admin.Prune, batch by batch and paced by s.Duty. It returns ctx's
// error when ctx is done; a failed round is logged and retried at the next
// tick.
func RunPruner(ctx context.Context, p admin.Pruner, s PruneSchedule) error {
	switch {
	case s.Every <= 0:
		return fmt.Errorf("RunPruner: PruneSchedule.Every must be positive, got %v", s.Every)
	case s.Retention <= 0:
		return fmt.Errorf("RunPruner: PruneSchedule.Retention must be positive, got %v", s.Retention)
	case s.Batch <= 0:
		return fmt.Errorf("RunPruner: PruneSchedule.Batch must be positive, got %d", s.Batch)
	case s.Duty != 0 && !(s.Duty > 0 && s.Duty <= 1):
		return fmt.Errorf("RunPruner: PruneSchedule.Duty must be in (0, 1], got %v", s.Duty)
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	tick := time.NewTicker(s.Every)
	defer tick.Stop()
	for {
		cut := s.Now().Add(-s.Retention)
		total, err := admin.Prune(ctx, p, cut, admin.PruneOptions{Batch: s.Batch, Duty: s.Duty})
		if err != nil && !errors.Is(err, ctx.Err()) {
			s.Logger.WarnContext(ctx, "idemq: prune failed", "table", s.Table, "err", err)
		}
		if total > 0 {
			s.Logger.InfoContext(ctx, "idemq: pruned claims", "table", s.Table, "rows", total, "before", cut)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
