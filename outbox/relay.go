package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/core/driver/retry"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/core/driver"
)

// firstBackoff is about the first wait after a failed claim or a lost
// listener connection (or the poll interval or the maximum backoff, if
// shorter); it doubles, with jitter, up to the maximum backoff
// (retry.Backoff), which no wait exceeds.
const firstBackoff = 100 * time.Millisecond

// finishTimeout bounds marking rows sent after the broker confirmed them;
// it runs even when the relay's context was cancelled meanwhile, so a
// shutdown does not needlessly republish a confirmed batch.
const finishTimeout = 10 * time.Second

// Relay publishes pending outbox rows and marks them sent once the broker
// confirmed them. Run any number of relays (in one process or many) on the
// same table: they share the work and keep per-key order (see the package
// documentation). Its methods are safe for concurrent use.
type Relay struct {
	store Store
	pub   driver.Publisher
	cfg   config
	wake  chan struct{}

	published atomic.Int64
	failures  atomic.Int64
	claims    atomic.Int64
	pruned    atomic.Int64
	parked    atomic.Int64

	pubCounter  metric.Int64Counter
	errCounter  metric.Int64Counter
	parkCounter metric.Int64Counter
	attrs       metric.MeasurementOption

	running sync.Mutex
}

// RelayStats counts what a Relay did since it was created.
type RelayStats struct {
	// Published counts rows published, confirmed and marked sent.
	Published int64
	// PublishErrors counts failed Publish calls (their rows stay pending,
	// or are parked).
	PublishErrors int64
	// Claims counts claim transactions that held at least one row.
	Claims int64
	// Pruned counts sent rows deleted after their retention.
	Pruned int64
	// Parked counts rows parked after WithMaxAttempts failed publishes, or
	// at the first failure marked permanent.
	Parked int64
}

// NewRelay returns a relay that moves rows of store to pub. It returns an
// error naming the option when one is invalid.
func NewRelay(store Store, pub driver.Publisher, opts ...Option) (*Relay, error) {
	if store == nil {
		return nil, errors.New("outbox: NewRelay: nil store")
	}
	if pub == nil {
		return nil, errors.New("outbox: NewRelay: nil publisher")
	}
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.meter == nil {
		cfg.meter = otel.GetMeterProvider()
	}
	r := &Relay{store: store, pub: pub, cfg: cfg, wake: make(chan struct{}, 1)}
	m := cfg.meter.Meter("github.com/idemq/idemq/outbox")
	r.attrs = metric.WithAttributes(attribute.String("idemq.outbox", cfg.name))
	var err1, err2, err3 error
	r.pubCounter, err1 = m.Int64Counter("idemq.outbox.published", metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows published, confirmed by the broker and marked sent."))
	r.errCounter, err2 = m.Int64Counter("idemq.outbox.publish_errors", metric.WithUnit("{call}"),
		metric.WithDescription("Failed publish calls; their rows stay pending and are retried."))
	r.parkCounter, err3 = m.Int64Counter("idemq.outbox.parked", metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows parked after too many failed publishes; they wait for an operator."))
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, fmt.Errorf("outbox: metrics: %w", err)
	}
	return r, nil
}

// Stats returns what the relay did so far.
func (r *Relay) Stats() RelayStats {
	return RelayStats{
		Published:     r.published.Load(),
		PublishErrors: r.failures.Load(),
		Claims:        r.claims.Load(),
		Pruned:        r.pruned.Load(),
		Parked:        r.parked.Load(),
	}
}

// Wake makes an idle Run look for rows at once. Writers in the same process
// can call it after committing when the store has no notifications.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run relays until ctx is done, then returns nil (or the error that
// stopped it). It listens for the store's notifications when it has them,
// polls every poll interval otherwise, backs off after failures, prunes
// sent rows past the retention and reports the pending gauges. A Relay runs
// once at a time; run more Relays to share the work.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.TryLock() {
		return errors.New("outbox: Relay.Run is already running")
	}
	defer r.running.Unlock()

	reg, err := r.registerGauges()
	if err != nil {
		return err
	}
	defer reg.Unregister()

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	if n, ok := r.store.(Notifier); ok && r.cfg.notify {
		wg.Add(1)
		go func() { defer wg.Done(); r.listen(ctx, n) }()
	}
	if r.cfg.retention > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); r.prune(ctx) }()
	}

	backoff := retry.New(min(r.cfg.poll, firstBackoff, r.cfg.maxBackoff), r.cfg.maxBackoff)
	for {
		n, err := r.RunOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			wait := backoff.Next()
			r.cfg.logger.Warn("outbox: relay batch failed; rows stay pending", "relay", r.cfg.name, "published", n, "error", err, "retry_in", wait)
			// A notification does not cut the backoff short: the broker
			// is probably still down.
			if !retry.Sleep(ctx, wait) {
				return nil
			}
			continue
		}
		backoff.Reset()
		if n > 0 {
			continue // more may be pending: no wait
		}
		t := time.NewTimer(r.cfg.poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-r.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// RunOnce claims one batch, publishes it and marks what the broker
// confirmed. It returns how many rows it published and marked; 0 with a nil
// error means nothing was pending that no other relay held.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	c, err := r.store.Claim(ctx, r.cfg.batch, r.cfg.window, r.cfg.parked)
	if err != nil {
		return 0, fmt.Errorf("outbox: claim: %w", err)
	}
	if c == nil {
		return 0, nil
	}
	rows := c.Rows()
	if len(rows) == 0 {
		return 0, c.Abort(context.WithoutCancel(ctx))
	}
	r.claims.Add(1)

	// The messages carry the writer's trace context in their headers; a
	// span in the relay's context must not replace it (publishers inject
	// the context they are given).
	pubCtx := trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	var out batch
	var errs []error
	for _, g := range byDestination(rows) {
		err := r.publish(pubCtx, g.dest, g.rows)
		if err == nil {
			for _, row := range g.rows {
				out.Sent = append(out.Sent, row.Seq)
			}
			continue
		}
		r.publishFailed(ctx)
		errs = append(errs, fmt.Errorf("outbox: publish %d rows to %q: %w", len(g.rows), g.dest, err))
		g, err = r.refused(g, err, &out)
		if len(g.rows) > 1 && (r.parksAtOnce(err) || slices.ContainsFunc(g.rows, r.due)) {
			r.isolate(pubCtx, g, err, &out)
			continue
		}
		r.fail(&out, g.rows, err, true)
	}
	out.Delete = r.cfg.retention == 0
	// Marking runs even if ctx was cancelled meanwhile: a shutdown need
	// not republish a batch the broker confirmed.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	if err := c.Finish(fctx, out.Outcome); err != nil {
		// Published but not marked: they are published again later and
		// the consumers' dedup absorbs the copies.
		return 0, errors.Join(append(errs, fmt.Errorf("outbox: marking %d published rows sent: %w", len(out.Sent), err))...)
	}
	r.published.Add(int64(len(out.Sent)))
	r.pubCounter.Add(ctx, int64(len(out.Sent)), r.attrs)
	for _, p := range out.parked {
		r.cfg.logger.Error("outbox: row parked after failed publishes; it waits for an operator (idemq outbox list)",
			"relay", r.cfg.name, "row", p.row.Seq, "id", p.row.ID, "key", p.row.Key, "destination", p.row.Destination,
			"attempts", p.row.Attempts+1, "cause", p.cause, "parked_key", r.cfg.parked.String())
	}
	r.parked.Add(int64(len(out.parked)))
	r.parkCounter.Add(ctx, int64(len(out.parked)), r.attrs)
	return len(out.Sent), errors.Join(errs...)
}

// batch is what became of a claim's rows: the Outcome for the store, and
// the rows it parks, to log once the store recorded them.
type batch struct {
	Outcome
	parked []parkedRow
}

type parkedRow struct {
	row   *Row
	cause string
}

func (r *Relay) publishFailed(ctx context.Context) {
	r.failures.Add(1)
	r.errCounter.Add(ctx, 1, r.attrs)
}

// due reports whether row's next failure parks it.
func (r *Relay) due(row *Row) bool {
	return r.cfg.maxAttempts > 0 && row.Attempts+1 >= r.cfg.maxAttempts
}

// parksAtOnce reports whether a publish that failed with err parks its
// row at once: the publisher marked err permanent (driver.Permanent) and
// parking is on.
func (r *Relay) parksAtOnce(err error) bool {
	return r.cfg.maxAttempts > 0 && driver.IsPermanent(err)
}

// refused returns the rows of g that a publish, which failed with err,
// did not send, and the error to record for them: every row when err is
// not a *driver.Partial; else the rows the broker took go to out.Sent,
// and a row left alone gets its own error.
func (r *Relay) refused(g destGroup, err error, out *batch) (destGroup, error) {
	var p *driver.Partial
	if !errors.As(err, &p) || len(p.Errs) != len(g.rows) {
		return g, err
	}
	left := destGroup{dest: g.dest}
	var last error
	for i, row := range g.rows {
		if p.Errs[i] == nil {
			out.Sent = append(out.Sent, row.Seq)
			continue
		}
		left.rows = append(left.rows, row)
		last = p.Errs[i]
	}
	if len(left.rows) == 1 {
		return left, last
	}
	return left, err
}

// isolate publishes the rows of g, whose publish together failed with
// groupErr, one at a time in Seq order, so that only a row that fails on
// its own is parked. It stops at the first failure: the broker may be down
// rather than that row poisoned, and rows of a key stay in order, so the
// rest are postponed (none parked) with groupErr as their cause.
func (r *Relay) isolate(ctx context.Context, g destGroup, groupErr error, out *batch) {
	for i, row := range g.rows {
		err := r.publish(ctx, g.dest, g.rows[i:i+1])
		if err == nil {
			out.Sent = append(out.Sent, row.Seq)
			continue
		}
		r.publishFailed(ctx)
		r.fail(out, g.rows[i:i+1], err, true)
		r.fail(out, g.rows[i+1:], groupErr, false)
		return
	}
}

// fail adds rows, whose publish failed with err, to out: when park is
// set, those due, or all of them when err parks at once, as parked; the
// others as postponed.
func (r *Relay) fail(out *batch, rows []*Row, err error, park bool) {
	cause := Cause(err)
	now := park && r.parksAtOnce(err)
	var parked, postponed []int64
	attempts := 0
	for _, row := range rows {
		if park && (now || r.due(row)) {
			parked = append(parked, row.Seq)
			out.parked = append(out.parked, parkedRow{row, cause})
			continue
		}
		postponed = append(postponed, row.Seq)
		attempts = max(attempts, row.Attempts+1)
	}
	if len(parked) > 0 {
		out.Failed = append(out.Failed, Failure{Seqs: parked, Cause: cause, Park: true})
	}
	if len(postponed) > 0 {
		out.Failed = append(out.Failed, Failure{Seqs: postponed, Cause: cause, RetryAfter: r.retryDelay(attempts)})
	}
}

// MaxCauseLength is the most bytes of a publish error that a store keeps
// as a row's cause.
const MaxCauseLength = 2000

// Cause is the text of err as a store records it: at most MaxCauseLength
// bytes, cut at a character boundary.
func Cause(err error) string {
	s := err.Error()
	if len(s) <= MaxCauseLength {
		return s
	}
	s = s[:MaxCauseLength]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// publish publishes rows to dest in one call.
func (r *Relay) publish(ctx context.Context, dest string, rows []*Row) error {
	msgs := make([]*driver.Message, len(rows))
	for i, row := range rows {
		msgs[i] = row.coreMessage()
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.publishTimeout)
	defer cancel()
	return r.pub.Publish(ctx, dest, msgs...)
}

// retryDelay is how long rows that failed for the n-th time are postponed.
func (r *Relay) retryDelay(n int) time.Duration {
	d := r.cfg.retryMin
	for i := 1; i < n && d < r.cfg.retryMax; i++ {
		d *= 2
	}
	return min(d, r.cfg.retryMax)
}

type destGroup struct {
	dest string
	rows []*Row
}

// byDestination splits rows (in Seq order) by destination, keeping Seq
// order inside each group, which is all per-key order needs: order across
// destinations has no meaning to any consumer.
func byDestination(rows []*Row) []destGroup {
	var groups []destGroup
	idx := map[string]int{}
	for _, row := range rows {
		i, ok := idx[row.Destination]
		if !ok {
			i = len(groups)
			idx[row.Destination] = i
			groups = append(groups, destGroup{dest: row.Destination})
		}
		groups[i].rows = append(groups[i].rows, row)
	}
	return groups
}

// listen keeps the store's notification listener running until ctx is
// done, reconnecting with a backoff; polling covers the gaps.
func (r *Relay) listen(ctx context.Context, n Notifier) {
	backoff := retry.New(min(firstBackoff, r.cfg.maxBackoff), r.cfg.maxBackoff)
	for {
		start := time.Now()
		err := n.Listen(ctx, r.Wake)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
			backoff.Reset() // it had recovered
		}
		wait := backoff.Next()
		r.cfg.logger.Warn("outbox: notification listener stopped; polling meanwhile", "relay", r.cfg.name, "error", err, "retry_in", wait)
		if !retry.Sleep(ctx, wait) {
			return
		}
	}
}

// prune deletes sent rows older than the retention every prune interval,
// in transactions of at most pruneBatch rows.
func (r *Relay) prune(ctx context.Context) {
	retry.Every(ctx, r.cfg.pruneInterval, func(time.Time) {
		if _, err := r.Prune(ctx, time.Now().Add(-r.cfg.retention)); err != nil && ctx.Err() == nil {
			r.cfg.logger.Warn("outbox: pruning sent rows failed", "relay", r.cfg.name, "error", err)
		}
	})
}

// Prune deletes rows sent before the given time, in transactions of at
// most the prune batch, and returns how many it deleted. Run calls it every
// prune interval; call it yourself when several relays should not all
// prune.
func (r *Relay) Prune(ctx context.Context, before time.Time) (int, error) {
	total := 0
	for {
		n, err := r.store.Prune(ctx, before, r.cfg.pruneBatch)
		total += n
		r.pruned.Add(int64(n))
		if err != nil {
			return total, fmt.Errorf("outbox: prune: %w", err)
		}
		if n < r.cfg.pruneBatch {
			return total, nil
		}
	}
}

// gaugeTimeout bounds the count query of one metrics collection.
const gaugeTimeout = 5 * time.Second

func (r *Relay) registerGauges() (metric.Registration, error) {
	m := r.cfg.meter.Meter("github.com/idemq/idemq/outbox")
	pending, err1 := m.Int64ObservableGauge("idemq.outbox.pending", metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows written and not yet published."))
	age, err2 := m.Float64ObservableGauge("idemq.outbox.oldest_pending_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest pending outbox row (0 when none): how far the relay lags."))
	parked, err3 := m.Int64ObservableGauge("idemq.outbox.parked_rows", metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows parked after too many failed publishes, waiting for an operator."))
	held, err4 := m.Int64ObservableGauge("idemq.outbox.held_keys", metric.WithUnit("{key}"),
		metric.WithDescription("Ordering keys with pending rows behind a parked row (held with HoldKey)."))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, fmt.Errorf("outbox: metrics: %w", err)
	}
	attrs := metric.WithAttributes(attribute.String("idemq.outbox", r.cfg.name))
	op, isOp := r.store.(Operator)
	reg, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, gaugeTimeout)
		defer cancel()
		var st TableStats
		var err error
		if isOp {
			st, err = op.Stats(ctx)
		} else {
			st.Pending, st.OldestPending, err = r.store.Pending(ctx)
		}
		if err != nil {
			return fmt.Errorf("outbox: counting pending rows: %w", err)
		}
		o.ObserveInt64(pending, st.Pending, attrs)
		o.ObserveFloat64(age, st.OldestPending.Seconds(), attrs)
		if isOp {
			o.ObserveInt64(parked, st.Parked, attrs)
			o.ObserveInt64(held, st.HeldKeys, attrs)
		}
		return nil
	}, pending, age, parked, held)
	if err != nil {
		return nil, fmt.Errorf("outbox: metrics: %w", err)
	}
	return reg, nil
}
