package outbox

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemq/idemq/core/driver/option"
)

// Defaults of the relay options (see the With… functions).
const (
	DefaultBatchSize      = 100
	DefaultWindowFactor   = 10
	DefaultPollInterval   = time.Second
	DefaultRetention      = 24 * time.Hour
	DefaultPruneInterval  = time.Minute
	DefaultPruneBatch     = 1000
	DefaultMaxBackoff     = 30 * time.Second
	DefaultPublishTimeout = 30 * time.Second
	DefaultRetryMin       = time.Second
	DefaultRetryMax       = 5 * time.Minute
	DefaultMaxAttempts    = 20
	DefaultName           = "outbox"
)

type config struct {
	name          string
	batch         int
	window        int
	poll          time.Duration
	retention     time.Duration
	pruneInterval time.Duration
	pruneBatch    int
	maxBackoff    time.Duration
	notify        bool
	logger        *slog.Logger
	meter         metric.MeterProvider

	retryMin, retryMax time.Duration
	publishTimeout     time.Duration
	maxAttempts        int
	parked             ParkedKeyPolicy
}

// Option configures a Relay. An invalid value makes NewRelay fail with an
// error naming the option.
type Option func(*config) error

// invalid is the error of option name when bad, its value failing the
// check: "outbox: name: " and the reason; nil when the value is good.
func invalid(bad bool, name, format string, args ...any) error {
	if !bad {
		return nil
	}
	return fmt.Errorf("outbox: %s: %s", name, fmt.Sprintf(format, args...))
}

// WithName names the relay in logs and in the idemq.outbox attribute of its
// metrics. Default "outbox".
func WithName(name string) Option {
	return option.Check(invalid(name == "", "WithName", "empty name"), func(c *config) { c.name = name })
}

// WithBatchSize sets how many rows one claim transaction holds at most
// (also the most messages of one Publish call). Default 100.
func WithBatchSize(n int) Option {
	return option.Check(invalid(n < 1 || n > 10000, "WithBatchSize", "must be within [1, 10000], got %d", n),
		func(c *config) { c.batch = n })
}

// WithWindow sets how many of the oldest pending rows a claim looks at for
// heads of keys. A larger window lets more relays find free keys when many
// are held; a smaller one makes the claim query cheaper with a deep
// backlog. Must be at least the batch size. Default 10 × the batch size.
func WithWindow(n int) Option {
	return option.Check(invalid(n < 1, "WithWindow", "must be positive, got %d", n), func(c *config) { c.window = n })
}

// WithPollInterval sets how long an idle relay waits before looking for
// rows again when no notification woke it (the fallback when LISTEN/NOTIFY
// is off, unavailable, or a notification was lost). Default 1s.
func WithPollInterval(d time.Duration) Option {
	return positive("WithPollInterval", d, func(c *config) *time.Duration { return &c.poll })
}

// WithRetention sets how long sent rows are kept (for audits and
// replays) before the relay prunes them. Zero deletes rows as soon as they
// are sent. Default 24h.
func WithRetention(d time.Duration) Option {
	return option.Check(invalid(d < 0, "WithRetention", "must not be negative, got %v", d), func(c *config) { c.retention = d })
}

// WithPruneInterval sets how often the relay deletes sent rows older than
// the retention, and how many it deletes per transaction (it loops until
// fewer remain, so no giant DELETE holds locks). Default every 1m, 1000 per
// transaction.
func WithPruneInterval(every time.Duration, batch int) Option {
	err := invalid(every <= 0, "WithPruneInterval", "interval must be positive, got %v", every)
	if err == nil {
		err = invalid(batch < 1, "WithPruneInterval", "batch must be positive, got %d", batch)
	}
	return option.Check(err, func(c *config) { c.pruneInterval, c.pruneBatch = every, batch })
}

// WithMaxBackoff caps how long a relay waits after a failed batch (a
// claim the database refused, a failed publish) before it claims again;
// the wait doubles (with jitter) from the poll interval up to it.
// Default 30s.
func WithMaxBackoff(d time.Duration) Option {
	return positive("WithMaxBackoff", d, func(c *config) *time.Duration { return &c.maxBackoff })
}

// WithRetryBackoff sets how long rows whose publish failed are left alone:
// min after the first failure, doubling with each further one, at most
// max, until WithMaxAttempts parks them. Meanwhile the relays publish
// other rows, so one broken destination does not hold up the rest; rows
// with the same ordering key as a postponed row wait behind it. Default 1s
// to 5m.
func WithRetryBackoff(min, max time.Duration) Option {
	return option.Check(invalid(min <= 0 || max < min, "WithRetryBackoff", "need 0 < min <= max, got %v and %v", min, max),
		func(c *config) { c.retryMin, c.retryMax = min, max })
}

// WithMaxAttempts sets after how many failed publishes a row is parked: it
// is then neither pending nor sent, no relay claims it, and it keeps its
// place in its key until an operator redrives or purges it
// (outbox.Operator, or the idemq outbox command). The error of its last
// publish is kept as its cause. It is for messages no retry can deliver
// (rejected as too large, sent to a destination that does not exist),
// which would otherwise be retried forever.
//
// Rows of one destination are published in one call; when such a call
// fails and one of its rows is due to be parked, the relay publishes the
// rows one by one, so that only a row that fails alone is parked, and it
// stops at the first that fails (the rest are retried later).
//
// A broker outage makes every row fail too: n must cover the longest
// outage to ride out. The default, 20, is about an hour of failures with
// the default retry backoff (1s doubling to 5m). 0 never parks a row;
// negative is an error.
//
// A row whose publish fails alone with an error the publisher marked
// permanent (core.Permanent, core.IsPermanent) is parked at that first
// failure: the broker's answer says no retry can deliver it. A call of
// several rows that fails so is first published row by row, as above.
// The rabbitmq, kafka and sqs publishers mark the answers that leave no
// doubt: a mandatory message returned unroutable (312 NO_ROUTE: no queue
// is bound for its routing key), records refused as too large
// (MESSAGE_TOO_LARGE), a queue that does not exist, and a message SQS
// refuses as the sender's fault (too large for the queue, characters SQS
// does not take). With n = 0 no row is parked, permanent or not.
func WithMaxAttempts(n int) Option {
	return option.Check(invalid(n < 0, "WithMaxAttempts", "must not be negative (0 never parks), got %d", n),
		func(c *config) { c.maxAttempts = n })
}

// ParkedKeyPolicy says what becomes of the rows behind a parked row of the
// same ordering key.
type ParkedKeyPolicy int

const (
	// HoldKey keeps the rows behind a parked row pending and unpublished
	// until the parked row is redriven or purged: the key's messages still
	// reach the broker in commit order, the promise the outbox makes. As
	// that promise holds per destination, a later row of the key bound
	// elsewhere and claimed in the same batch as the row being parked may
	// be published in that batch; from the next claim on, the key waits.
	HoldKey ParkedKeyPolicy = iota
	// SkipParked lets the key's next row be published as if the parked one
	// were not there: the key's later messages flow, and the parked one,
	// if redriven, arrives after them.
	SkipParked
)

// String returns "hold-key" or "skip-parked".
func (p ParkedKeyPolicy) String() string {
	switch p {
	case HoldKey:
		return "hold-key"
	case SkipParked:
		return "skip-parked"
	}
	return fmt.Sprintf("ParkedKeyPolicy(%d)", int(p))
}

// WithParkedKey sets what a parked row does to the rows behind it in its
// key (see WithMaxAttempts). The default is HoldKey, because it keeps
// per-key order: consumers that apply a key's messages in order never see
// a later message before an earlier one, whatever is parked. The price is
// availability: a parked row stops its key until an operator acts (the
// key shows in TableStats.HeldKeys). SkipParked keeps the key's other
// messages flowing, for keys whose consumers tolerate a gap, or a message
// arriving late after a redrive.
func WithParkedKey(p ParkedKeyPolicy) Option {
	return option.Check(invalid(p != HoldKey && p != SkipParked, "WithParkedKey", "unknown policy %d", int(p)),
		func(c *config) { c.parked = p })
}

// WithPublishTimeout bounds one Publish call. The claimed rows stay locked
// while the broker confirms, so a hung broker must not hold them forever;
// a timed-out publish counts as failed. Default 30s.
func WithPublishTimeout(d time.Duration) Option {
	return positive("WithPublishTimeout", d, func(c *config) *time.Duration { return &c.publishTimeout })
}

// WithNotify turns waiting for the store's notifications (Postgres
// LISTEN/NOTIFY) on or off; polling continues either way. Default on when
// the store supports it.
func WithNotify(on bool) Option {
	return option.Check(nil, func(c *config) { c.notify = on })
}

// WithLogger sets the logger for publish failures and listener trouble.
// Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return option.Check(invalid(l == nil, "WithLogger", "nil logger"), func(c *config) { c.logger = l })
}

// WithMeterProvider sets where the relay's metrics go: the observable
// gauges idemq.outbox.pending (rows) and idemq.outbox.oldest_pending_age
// (seconds), with a store that implements Operator also
// idemq.outbox.parked_rows and idemq.outbox.held_keys, and the counters
// idemq.outbox.published, idemq.outbox.publish_errors and
// idemq.outbox.parked (rows this relay parked). Default otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return option.Check(invalid(mp == nil, "WithMeterProvider", "nil provider"), func(c *config) { c.meter = mp })
}

// positive is an option that sets the duration at field to d, which must
// be positive; name is the option named in its error.
func positive(name string, d time.Duration, field func(*config) *time.Duration) Option {
	return option.Check(invalid(d <= 0, name, "must be positive, got %v", d), func(c *config) { *field(c) = d })
}

func buildConfig(opts []Option) (config, error) {
	c := config{
		name:           DefaultName,
		batch:          DefaultBatchSize,
		poll:           DefaultPollInterval,
		retention:      DefaultRetention,
		pruneInterval:  DefaultPruneInterval,
		pruneBatch:     DefaultPruneBatch,
		maxBackoff:     DefaultMaxBackoff,
		retryMin:       DefaultRetryMin,
		publishTimeout: DefaultPublishTimeout,
		retryMax:       DefaultRetryMax,
		maxAttempts:    DefaultMaxAttempts,
		parked:         HoldKey,
		notify:         true,
		logger:         slog.Default(),
	}
	errs := []error{option.ApplyAll(&c, opts...)}
	if c.window == 0 {
		c.window = c.batch * DefaultWindowFactor
	}
	errs = append(errs, invalid(c.window < c.batch, "WithWindow", "window %d is smaller than the batch size %d", c.window, c.batch))
	return c, errors.Join(errs...)
}
