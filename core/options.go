package core

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemq/idemq/core/driver/option"
)

// Option configures a Consumer. Options are checked by New, which fails
// with an error naming the option when a value is out of range.
type Option func(*config) error

type config struct {
	name            string
	concurrency     int
	window          int
	batchSize       int
	linger          time.Duration
	maxAttempts     int
	backoff         Backoff
	idFunc          func(*Message) (string, error)
	limits          Limits
	shutdownTimeout time.Duration
	settleTimeout   time.Duration
	txnTimeout      time.Duration
	probeFirst      time.Duration
	probeMax        time.Duration
	probeTimeout    time.Duration
	logger          *slog.Logger
	observers       []Observer
	stageObservers  []StageObserver
	handlerMW       []HandlerMiddleware
	externalMW      []ExternalMiddleware
	fingerprint     func([]byte) string
	mismatch        Decision
	isolation       Isolation
	strictRetention bool
	// strictDeliveryLimit refuses a broker whose delivery limit is below
	// maxAttempts.
	strictDeliveryLimit bool
	// unboundedHorizon accepts a broker with no age limit.
	unboundedHorizon bool
}

// Isolation says how a batch keeps a failed message's effects and claim
// apart from the rest of its transaction.
type Isolation int

const (
	// IsolateReplay runs the handlers of a batch with no savepoints. When
	// one fails, the whole transaction rolls back and the batch runs again
	// in a new one without the failed message. Nothing extra is sent while
	// handlers succeed, which is what batch throughput needs; the price is
	// that on a failure the other handlers run again (their first run was
	// rolled back and left no trace). Handlers must keep every effect in
	// the transaction, as they must anyway for redeliveries. Default.
	IsolateReplay Isolation = iota
	// IsolateSavepoints runs each handler of a batch under a savepoint; a
	// failure rolls back to it and deletes the message's claim, and the
	// rest of the batch commits. No handler runs twice within a delivery,
	// but every message costs two more round trips (SAVEPOINT, RELEASE)
	// when several share a transaction.
	IsolateSavepoints
)

func defaultConfig() config {
	return config{
		concurrency:     1,
		batchSize:       1,
		maxAttempts:     5,
		backoff:         DefaultBackoff,
		limits:          Limits{IDBytes: 255},
		shutdownTimeout: 30 * time.Second,
		settleTimeout:   10 * time.Second,
		txnTimeout:      time.Minute,
		probeFirst:      100 * time.Millisecond,
		probeMax:        2 * time.Second,
		probeTimeout:    5 * time.Second,
		fingerprint:     Fingerprint,
		mismatch:        DeadLetter,
	}
}

func optErr(name, format string, args ...any) error {
	return option.Errorf("idemq", name, format, args...)
}

// set is an option that sets a field once its check passed.
func set(name string, check error, put func(*config)) Option {
	return option.Set("idemq", name, check, put)
}

// WithName sets the consumer name, the first half of the dedup key
// (consumer, message_id): two consumers with different names each apply a
// message once. Required; at most 200 characters of valid UTF-8.
func WithName(name string) Option {
	return set("WithName", validateName(name), func(c *config) { c.name = name })
}

// WithConcurrency sets how many batches are processed at once, each in its
// own transaction. Default 1: one worker, as in the seed pattern. SQLite
// serialises writers, so more than 1 helps only on Postgres and MySQL.
// Workers fill their batches one at a time, so free workers do not split
// what has queued between them. Without WithLinger, a free worker does not
// start a part-full batch while another is in flight if, at the recent
// arrival rate, the batch would fill within the time the last batch took:
// it waits that long at most, so the window is not cut into small
// transactions, and batches of slow handlers still overlap. Under a source
// that leaves each key's order to the Consumer (Kafka's per-key order),
// each key's messages go to one worker's own queue, which fills at its
// share of the rate: the worker waits (at most a batch time) when its
// share would fill the batch within as many batch times as there are
// workers.
func WithConcurrency(n int) Option {
	return set("WithConcurrency", option.Range(n, 1, 1024), func(c *config) { c.concurrency = n })
}

// WithWindow caps the messages received but not yet settled: memory stays
// bounded by it whatever the queue depth, and adapters use it as their
// prefetch. Under NewLeased it also bounds the External calls in flight.
// Default 4 × batch size × concurrency, at least 8: the broker keeps
// sending while a batch is decided and its acks travel back, so the next
// batch is full when the worker is free.
func WithWindow(n int) Option {
	return set("WithWindow", option.AtLeast(n, 1), func(c *config) { c.window = n })
}

// WithBatchSize sets how many messages at most share one transaction: one
// multi-row claim, the handlers (WithIsolation says how a failing one is
// kept from the others), one commit, one batch ack. Default 1, which is
// exactly the one-transaction-per-message pattern.
func WithBatchSize(n int) Option {
	return set("WithBatchSize", option.Range(n, 1, 10000), func(c *config) { c.batchSize = n })
}

// WithLinger sets how long a batch waits for more messages before it is
// processed part-full. Default 0: a batch goes as soon as a worker is free,
// so batches grow on their own under load and add no latency when idle.
func WithLinger(d time.Duration) Option {
	return set("WithLinger", option.Range(d, 0, time.Minute), func(c *config) { c.linger = d })
}

// WithMaxAttempts sets after how many deliveries a message whose handler
// keeps failing with a transient error is dead-lettered. Default 5. Store
// failures (begin, claim, commit) are retried without limit: an outage of
// the database must not empty the queue into the dead-letter queue. n must
// not exceed the delivery limit of a broker that drops a message at its
// limit instead of parking it (see WithStrictDeliveryLimit).
func WithMaxAttempts(n int) Option {
	return set("WithMaxAttempts", option.AtLeast(n, 1), func(c *config) { c.maxAttempts = n })
}

// WithBackoff sets the redelivery delay policy for Retry. Default
// DefaultBackoff (200ms doubling to 30s, ±20% jitter).
func WithBackoff(b Backoff) Option {
	return set("WithBackoff", option.NotNil(b != nil, "backoff"), func(c *config) { c.backoff = b })
}

// WithIDFunc derives the business id from the message instead of the
// adapter's default (AMQP message_id, the Kafka or SQS message-id header).
// An error from f, or an empty id, dead-letters the message with the cause.
// Never derive the id from a delivery tag, offset or receipt handle: they
// change on redelivery.
func WithIDFunc(f func(*Message) (string, error)) Option {
	return set("WithIDFunc", option.NotNil(f != nil, "func"), func(c *config) { c.idFunc = f })
}

// Limits bound what one message may bring into the pipeline. A message
// over a limit is dead-lettered before any transaction, with ErrInvalidID
// (the id) or ErrTooLarge (body, headers) as its cause, so a hostile or
// broken producer cannot make the store or the handler take it.
type Limits struct {
	// IDBytes is the longest id accepted, 1..4096. Default 255, which
	// fits every store's key column.
	IDBytes int
	// BodyBytes is the largest body accepted; 0 (default) accepts any
	// size the broker delivers.
	BodyBytes int
	// Headers is the most headers accepted; 0 (default) accepts any
	// number.
	Headers int
}

// WithLimits sets the Limits; a zero IDBytes keeps the default 255.
func WithLimits(l Limits) Option {
	return func(c *config) error {
		if l.IDBytes == 0 {
			l.IDBytes = 255
		}
		if l.IDBytes < 1 || l.IDBytes > 4096 {
			return optErr("WithLimits", "IDBytes %d is outside 1..4096", l.IDBytes)
		}
		if l.BodyBytes < 0 || l.Headers < 0 {
			return optErr("WithLimits", "BodyBytes %d and Headers %d may not be negative", l.BodyBytes, l.Headers)
		}
		c.limits = l
		return nil
	}
}

// WithShutdownTimeout bounds graceful shutdown: after Run's context is
// cancelled, messages already received have this long to finish; then
// their transactions are cancelled (rolled back) and they are left
// unacknowledged for the broker to redeliver. Closing the source gets what
// is left of the bound (at least a second, or the whole bound if shorter):
// Run returns then even if the source's Close still blocks, as a Kafka
// group join waiting out a dead member does (the Close goes on in the
// background). Default 30s.
func WithShutdownTimeout(d time.Duration) Option {
	return set("WithShutdownTimeout", option.Positive(d), func(c *config) { c.shutdownTimeout = d })
}

// WithTransactionTimeout bounds one dedup transaction, its handlers
// included: when it passes, the handlers' context is done, the transaction
// rolls back and its messages are decided again (after a probe of the
// store, see WithStoreProbe). It is what frees a worker whose database
// connection went half-open (the peer gone without a reset, every packet
// swallowed), which would otherwise wait on it for as long as the
// operating system keeps the socket. Default 1m; 0 disables it. Handlers
// that call slow services inside the transaction need a bound above their
// slowest call.
func WithTransactionTimeout(d time.Duration) Option {
	return set("WithTransactionTimeout", option.AtLeast(d, 0), func(c *config) { c.txnTimeout = d })
}

// WithStoreProbe sets how the Consumer waits out a store that does not
// answer. When a transaction fails at a step of the store's own (begin,
// claim, commit) or a handler fails, the Consumer opens and rolls back a
// probe transaction; if that fails too, it pauses: it takes no new
// deliveries and holds those it has (spending none of the broker's
// delivery count, so an outage parks nothing under an SQS maxReceiveCount
// or a quorum queue's delivery-limit), and probes again after first, then
// after waits doubling up to max (±20% jitter), each probe bounded by 5s.
// When a probe succeeds, the held transactions run again at once. Default
// 100ms, 2s: a store back after an outage is used again within about 2s.
func WithStoreProbe(first, max time.Duration) Option {
	bad := option.Refuse(first <= 0 || max < first, "need 0 < first <= max, got %v, %v", first, max)
	return set("WithStoreProbe", bad, func(c *config) { c.probeFirst, c.probeMax = first, max })
}

// WithStrictRetention makes Run refuse to start, with an error naming both
// durations, when the store keeps claims for less time than the broker can
// redeliver a message (its redelivery horizon: SQS message retention,
// Kafka topic retention, unbounded for a RabbitMQ queue), instead of only
// warning. A message redelivered after its claim was pruned would be
// applied twice. Default off: a warning at start-up.
func WithStrictRetention() Option {
	return func(c *config) error { c.strictRetention = true; return nil }
}

// WithStrictDeliveryLimit makes Run refuse to start, with an error naming
// both numbers, when the broker stops redelivering a message after fewer
// deliveries than WithMaxAttempts allows and archives or drops it rather
// than parking it (a Kafka share group's
// group.share.delivery.count.limit), instead of only warning. The broker
// would then drop a message whose handler keeps failing before the
// Consumer dead-letters it: neither applied nor parked. A limit equal to
// MaxAttempts is enough, because the Consumer dead-letters a message whose
// handler fails on its MaxAttempts-th delivery rather than retrying it.
// Default off: a warning at start-up.
func WithStrictDeliveryLimit() Option {
	return func(c *config) error { c.strictDeliveryLimit = true; return nil }
}

// WithUnboundedHorizon accepts, knowingly, a broker that sets no age limit
// on the messages it keeps (a RabbitMQ queue without a TTL, a NATS stream
// without MaxAge, a Kafka topic with retention.ms=-1), for a service whose
// messages never wait in the broker as long as the store keeps claims: Run
// then neither warns about such a horizon nor refuses to start under
// WithStrictRetention. A bounded horizon longer than the store's retention
// still does. Default off.
func WithUnboundedHorizon() Option {
	return func(c *config) error { c.unboundedHorizon = true; return nil }
}

// WithLogger sets the logger for reconnects, settlement failures and
// warnings. Decisions are logged by the logging observer, not here.
// Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return set("WithLogger", option.NotNil(l != nil, "logger"), func(c *config) { c.logger = l })
}

// WithHandlerMiddleware appends middleware around what runs inside the
// transaction: a Handler, a BatchHandler, or a leased consumer's
// Complete. It never wraps a leased consumer's External call (see
// WithExternalMiddleware). The first given is the outermost.
func WithHandlerMiddleware(mws ...HandlerMiddleware) Option {
	return set("WithHandlerMiddleware", option.NoneNil(mws, "middleware"), func(c *config) { c.handlerMW = append(c.handlerMW, mws...) })
}

// WithExternalMiddleware appends middleware around a leased consumer's
// External call, which runs outside any transaction (NewLeased); the first
// given is the outermost. New and NewBatch refuse it.
func WithExternalMiddleware(mws ...ExternalMiddleware) Option {
	return set("WithExternalMiddleware", option.NoneNil(mws, "middleware"), func(c *config) { c.externalMW = append(c.externalMW, mws...) })
}

// WithFingerprint sets how a body is fingerprinted for the reused-id check.
// Default Fingerprint (128 bits of SHA-256). nil turns the check off.
func WithFingerprint(f func(body []byte) string) Option {
	return set("WithFingerprint", nil, func(c *config) { c.fingerprint = f })
}

// WithMismatchDecision sets what happens to a message whose id was
// already processed with a different body: DeadLetter (default), with
// ErrFingerprintMismatch, so an operator sees the reused id; or Duplicate
// (acknowledged, not applied), for producers known to re-encode bodies on
// resend.
func WithMismatchDecision(d Decision) Option {
	bad := option.Refuse(d != DeadLetter && d != Duplicate, "%v: only dead_letter or duplicate", d)
	return set("WithMismatchDecision", bad, func(c *config) { c.mismatch = d })
}

// WithIsolation sets how a failing message in a batch is kept from the
// others. Default IsolateReplay. It does not matter at batch size 1 or
// for a BatchHandler (whose failures are isolated by deciding each message
// of the batch alone).
func WithIsolation(i Isolation) Option {
	bad := option.Refuse(i != IsolateReplay && i != IsolateSavepoints, "unknown isolation %d", i)
	return set("WithIsolation", bad, func(c *config) { c.isolation = i })
}

func validateName(name string) error {
	if name == "" {
		return errors.New("empty consumer name")
	}
	if len(name) > 200 {
		return fmt.Errorf("consumer name is %d bytes, at most 200", len(name))
	}
	if err := validateIDBytes(name); err != nil {
		return err
	}
	return nil
}
