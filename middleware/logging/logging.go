// Package logging writes one log/slog line per idemq decision, at a level
// that fits it: processed at debug, duplicate at info, retry at warn, dead
// letter at error, each with the message id and, for failures, the cause.
// Bodies are never logged unless WithBody asks for them.
package logging

import (
	"context"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver/option"
)

// Option configures New, which fails with an error naming the option when
// a value is invalid.
type Option func(*config) error

type config struct {
	levels  map[core.Decision]slog.Level
	bodyMax int
}

// WithLevel sets the level for one decision, which must be one of
// Processed, Duplicate, Retry and DeadLetter. Defaults: Processed debug,
// Duplicate info, Retry warn, DeadLetter error.
func WithLevel(d core.Decision, l slog.Level) Option {
	var err error
	if d < core.Processed || d > core.DeadLetter {
		err = fmt.Errorf("unknown decision %d", int(d))
	}
	return option.Set("logging", "WithLevel", err, func(c *config) { c.levels[d] = l })
}

// WithBody adds up to max bytes of the body to each line; 0 logs none.
// Default: bodies are never logged, because they often hold personal or
// payment data. Must not be negative.
func WithBody(max int) Option {
	return option.Set("logging", "WithBody", option.AtLeast(max, 0), func(c *config) { c.bodyMax = max })
}

// Logging is a core.Observer that writes one line per decision. Install
// it with core.WithObserver.
type Logging struct {
	logger *slog.Logger
	cfg    config
}

// New returns a Logging writing to logger (nil means slog.Default()), or
// the error of an option given an invalid value.
func New(logger *slog.Logger, opts ...Option) (*Logging, error) {
	if logger == nil {
		logger = slog.Default()
	}
	cfg := config{levels: map[core.Decision]slog.Level{
		core.Processed:  slog.LevelDebug,
		core.Duplicate:  slog.LevelInfo,
		core.Retry:      slog.LevelWarn,
		core.DeadLetter: slog.LevelError,
	}}
	if err := option.Apply(&cfg, opts...); err != nil {
		return nil, err
	}
	return &Logging{logger: logger, cfg: cfg}, nil
}

type startKey struct{}

// StartDecision implements core.Observer: it notes when the decision
// began, for the line's "took".
func (l *Logging) StartDecision(ctx context.Context, _ *core.Message) context.Context {
	return context.WithValue(ctx, startKey{}, time.Now())
}

// EndDecision implements core.Observer: it writes the decision's line at
// the decision's level.
func (l *Logging) EndDecision(ctx context.Context, m *core.Message, out core.Outcome) {
	level, ok := l.cfg.levels[out.Decision]
	if !ok {
		level = slog.LevelError
	}
	if !l.logger.Enabled(ctx, level) {
		return
	}
	var took time.Duration
	if start, ok := ctx.Value(startKey{}).(time.Time); ok {
		took = time.Since(start)
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs,
		slog.String("consumer", core.ConsumerName(ctx)),
		slog.String("decision", out.Decision.String()),
		slog.String("id", clip(m.ID, 128)),
		slog.String("source", m.Source),
		slog.String("system", m.System),
		slog.Int("attempt", m.Attempt),
		slog.Duration("took", took),
	)
	if out.Err != nil {
		attrs = append(attrs, slog.String("cause", out.Err.Error()))
	}
	if out.Decision == core.Retry {
		attrs = append(attrs, slog.Duration("retry_in", out.Delay))
	}
	if l.cfg.bodyMax > 0 {
		attrs = append(attrs, slog.String("body", clip(string(m.Body), l.cfg.bodyMax)))
	}
	l.logger.LogAttrs(ctx, level, "idemq: "+out.Decision.String(), attrs...)
}

func clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := s[:max]
	for len(cut) > 0 && !utf8.ValidString(cut) {
		cut = cut[:len(cut)-1]
	}
	return cut + "…"
}
