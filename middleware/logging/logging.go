// Package logging writes one log/slog line per idemq decision, at a level
// that fits it: processed at debug, duplicate at info, retry at warn, dead
// letter at error, each with the message id and, for failures, the cause.
// Bodies are never logged unless WithBody asks for them.
package logging

import (
	"context"
	"log/slog"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/core"
)

// Option configures New.
type Option func(*config)

type config struct {
	levels  map[core.Decision]slog.Level
	bodyMax int
}

// WithLevel sets the level for one decision. Defaults: Processed debug,
// Duplicate info, Retry warn, DeadLetter error.
func WithLevel(d core.Decision, l slog.Level) Option {
	return func(c *config) { c.levels[d] = l }
}

// WithBody adds up to max bytes of the body to each line. Default: bodies
// are never logged, because they often hold personal or payment data.
func WithBody(max int) Option {
	return func(c *config) { c.bodyMax = max }
}

// New returns decision middleware logging to logger (nil means
// slog.Default()).
func New(logger *slog.Logger, opts ...Option) core.Middleware {
	if logger == nil {
		logger = slog.Default()
	}
	cfg := config{levels: map[core.Decision]slog.Level{
		core.Processed:  slog.LevelDebug,
		core.Duplicate:  slog.LevelInfo,
		core.Retry:      slog.LevelWarn,
		core.DeadLetter: slog.LevelError,
	}}
	for _, o := range opts {
		o(&cfg)
	}
	return func(next core.ProcessFunc) core.ProcessFunc {
		return func(ctx context.Context, m *core.Message) core.Outcome {
			start := time.Now()
			out := next(ctx, m)
			level, ok := cfg.levels[out.Decision]
			if !ok {
				level = slog.LevelError
			}
			if !logger.Enabled(ctx, level) {
				return out
			}
			attrs := make([]slog.Attr, 0, 10)
			attrs = append(attrs,
				slog.String("consumer", core.ConsumerName(ctx)),
				slog.String("decision", out.Decision.String()),
				slog.String("id", clip(m.ID, 128)),
				slog.String("source", m.Source),
				slog.String("system", m.System),
				slog.Int("attempt", m.Attempt),
				slog.Duration("took", time.Since(start)),
			)
			if out.Err != nil {
				attrs = append(attrs, slog.String("cause", out.Err.Error()))
			}
			if out.Decision == core.Retry {
				attrs = append(attrs, slog.Duration("retry_in", out.Delay))
			}
			if cfg.bodyMax > 0 {
				attrs = append(attrs, slog.String("body", clip(string(m.Body), cfg.bodyMax)))
			}
			logger.LogAttrs(ctx, level, "idemq: "+out.Decision.String(), attrs...)
			return out
		}
	}
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
