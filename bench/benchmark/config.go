package benchmark

import (
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/idemq/idemq/admin"
)

// Names of the configurations Run knows. Baselines are written by hand on
// the raw drivers (amqp091-go, pgx), without idemq; the idemq
// configurations run core.Consumer on the same data and the same effect.
const (
	// SeedP5 is the seed article's consumer: one transaction per message
	// (INSERT … ON CONFLICT DO NOTHING into the dedup table, UPDATE,
	// COMMIT, ack), prefetch 5, one worker.
	SeedP5 = "seed-p5"
	// SeedP100W8 is the same consumer with prefetch 100 and 8 workers
	// sharing one channel, each with its own transaction.
	SeedP100W8 = "seed-p100-w8"
	// HandBatch is the hand-tuned batch consumer: BatchSize messages per
	// transaction, one multi-row claim (INSERT … SELECT unnest … ON
	// CONFLICT DO NOTHING RETURNING), the effect as one set-based UPDATE
	// aggregated per account, one commit, one multiple ack.
	HandBatch = "hand-batch"
	// RawAck consumes and acknowledges (multiple, every BatchSize) with no
	// database: the broker's ceiling.
	RawAck = "raw-ack"
	// IdemqB1W5 is idemq at batch size 1, window 5, one worker: the seed
	// pattern through the framework.
	IdemqB1W5 = "idemq-b1-w5"
	// IdemqB1W100C8 is idemq at batch size 1, window 100, 8 workers.
	IdemqB1W100C8 = "idemq-b1-w100-c8"
	// IdemqQueue is idemq in batch mode with a per-message handler that
	// queues its UPDATE with postgres.Queue (one round trip per batch),
	// under core.IsolateReplay.
	IdemqQueue = "idemq-queue"
	// IdemqBatch is idemq in batch mode with a core.NewBatch set-based
	// BatchHandler (one UPDATE per batch, as the hand-tuned consumer).
	IdemqBatch = "idemq-batch"
	// IdemqBatchObserved is IdemqBatch with the tracing and metrics
	// observers on the OpenTelemetry SDK: every span sampled and batched
	// to an exporter that drops them, metrics into a manual reader. It
	// measures what observing costs the batch path.
	IdemqBatchObserved = "idemq-batch-observed"
	// IdemqBatchSampled is IdemqBatchObserved with 10% of traces sampled
	// (TraceIDRatioBased), as busy services run.
	IdemqBatchSampled = "idemq-batch-sampled"
	// Watermill is the seed pattern on Watermill (v1.4.7, with
	// watermill-amqp v3.0.2), RabbitMQ only: a message.Router whose
	// handlers each subscribe to the run's queue on their own channel and
	// run one store transaction per message (claim, UPDATE, COMMIT), acked
	// when the handler returns nil, nacked when it fails. A subscription
	// passes on one message at a time, so concurrency comes from the
	// number of handlers. It runs with prefetch 100 and 8 handlers, the best
	// of a sweep over prefetch 100/400/800 × handlers 1/8/16/32 measured
	// against seed-p100-w8 in the same run (results/watermill-sweep.txt):
	// about as fast as that baseline (1 handler reaches at most half of it).
	Watermill = "watermill"
	// SeedFranz is the seed pattern on franz-go, the client idemq's Kafka
	// adapter is built on (Kafka only): 8 consumer group members, each
	// taking one record at a time through one transaction, then a
	// synchronous offset commit.
	SeedFranz = "seed-franz"
	// HandBatchFranz is the hand-tuned batch consumer on franz-go (Kafka
	// only): BatchWorkers group members, each polling up to BatchSize
	// records into one batch transaction (as HandBatch's), then one
	// synchronous commit of the polled offsets.
	HandBatchFranz = "hand-batch-franz"

	// MemoryScenario measures the idemq batch consumer's peak RSS with
	// 10,000 and then 1,000,000 messages queued.
	// Not in the default set: publishing and consuming 1M takes minutes.
	MemoryScenario = "memory"
	// GrowthScenario measures idemq batch throughput with GrowthRows rows
	// already in the dedup table against an empty one, then the p99
	// decision latency while a prune of those 10M rows runs against the
	// quiet figure (target 5). Not in the default set: filling takes
	// minutes.
	GrowthScenario = "growth"
	// LeasedScenario compares, on Postgres, two consumers whose effect is
	// a slow external call (a fake payment provider answering every charge
	// after Config.ProviderDelay, idempotency key sent) followed by a
	// ledger row, with a pool of Config.Pool connections: "in-transaction"
	// (core.New, the call made inside the dedup transaction, as many
	// workers as connections), against "leased" (core.NewLeased, the call
	// made outside any transaction under a leased claim, window 500). It
	// reports msgs/s (target: leased ≥ 10 × in-transaction) and the
	// database transactions the consumer holds open, sampled from
	// pg_stat_activity: the most at once, and their time per delivery.
	// Not in the default set: the in-transaction run lasts about
	// N × ProviderDelay / Pool.
	LeasedScenario = "leased"
)

// DefaultConfigs are the configurations Run runs when Config.Configs is
// empty, in the order they are reported.
var DefaultConfigs = []string{SeedP5, SeedP100W8, HandBatch, RawAck, IdemqB1W5, IdemqB1W100C8, IdemqQueue, IdemqBatch}

// Scenarios are the slow configurations run only when named.
var Scenarios = []string{MemoryScenario, GrowthScenario, LeasedScenario}

// ObservedConfigs are the observed variants of IdemqBatch, run only when
// named.
var ObservedConfigs = []string{IdemqBatchObserved, IdemqBatchSampled}

// FrameworkConfigs are the configurations that run another framework's
// consumer on the same data and effect, run only when named.
var FrameworkConfigs = []string{Watermill}

// KafkaConfigs are the baselines written by hand on franz-go, beside the
// kafka-go ones of DefaultConfigs, run only when named (Kafka only).
var KafkaConfigs = []string{SeedFranz, HandBatchFranz}

// Config says what Run measures. Zero values take the defaults given on
// each field.
type Config struct {
	// Broker is the broker URL, one of (see BrokerSchemes):
	//
	//	amqp://guest:guest@127.0.0.1:5672/?queue=bench   RabbitMQ
	//	kafka://127.0.0.1:9092/bench?partitions=8        Kafka (e.g. bench/cmd/kfake)
	//	sqs://KEY:SECRET@bench?endpoint=http://127.0.0.1:9324&region=us-east-1
	//	pubsub://PROJECT/bench                           Pub/Sub (PUBSUB_EMULATOR_HOST for the emulator)
	//	nats://127.0.0.1:4222/bench                      NATS JetStream
	//	redis://127.0.0.1:6379/bench                     Redis Streams (rediss:// with TLS)
	//
	// Each run uses its own queue (topic, stream) named after the URL's
	// (default "idemq-bench") plus a random suffix, and deletes it
	// afterwards. The rest of the URL is what idemq's adapter reads, except
	// Kafka's partitions parameter (the run's topic's partitions, default
	// 8), which only the benchmark reads; a nats:// URL leaves out the
	// parameters the benchmark sets per run (consumer, subject, declare,
	// dlq_stream, dlq_subject) and id_header, a redis:// URL those it
	// sets per run or reads itself (group, start, dlq, id_field, id_header),
	// and a pubsub:// URL those it sets per run (topic, declare,
	// dead_letter_topic, max_deliveries, ordering, exactly_once).
	// Required.
	Broker string
	// Store is the database URL, e.g. postgres://postgres@127.0.0.1/test
	// or mysql://root@127.0.0.1:3306/test (see StoreSchemes). Each run
	// uses its own accounts and dedup tables and drops them afterwards.
	// Required.
	Store string
	// N is the number of unique messages per run. Default 50,000, and
	// 3,000 for LeasedScenario (its in-transaction run passes about
	// Pool / ProviderDelay msgs/s: 90 s at the defaults).
	N int
	// Duplicates is the fraction of N published a second time, each a
	// copy of a recently published message. Default 0.2 (60,000
	// deliveries for N = 50,000). Use a negative value for none.
	Duplicates float64
	// Accounts is the number of accounts the effect spreads over.
	// Default 1,000.
	Accounts int
	// BatchSize is the batch size of the batch-mode configurations, idemq
	// and hand-tuned alike. Default 200; for sqs:// 10, which is also its
	// maximum (SQS receives and deletes at most 10 messages a call); at
	// most 1,000 for pubsub:// (a Pull's most).
	BatchSize int
	// BatchWorkers is how many batches the batch-mode configurations
	// process at once, idemq (WithConcurrency) and hand-tuned (one channel
	// each) alike. Default 1.
	BatchWorkers int
	// Repeat is the number of runs per configuration; the report gives the
	// median and the min–max. Runs are interleaved (every configuration
	// once, then again), so a change in the machine's load spreads over all
	// of them. Default 3.
	Repeat int
	// Configs names the configurations to run (see DefaultConfigs,
	// ObservedConfigs, FrameworkConfigs, KafkaConfigs and Scenarios).
	// Default DefaultConfigs.
	Configs []string
	// LatencyRate is the rate, in messages per second, of the paced phase
	// that follows each run's backlog: its messages carry their publish
	// time, and the time from publish to decision gives p50/p99. A paced
	// rate below every configuration's capacity keeps queueing out of the
	// figure. Default 200.
	LatencyRate int
	// LatencyMessages is how many messages the paced phase publishes.
	// Default 1,000.
	LatencyMessages int
	// GrowthRows is how many old rows GrowthScenario puts in the dedup
	// table before measuring. Default 10,000,000.
	GrowthRows int
	// PruneBatch is the rows per Prune call while GrowthScenario prunes
	// those rows (one admin.Prune round, as a service's
	// a store's RunPruner does).
	// Default 1,000, the batch of idemq prune.
	PruneBatch int
	// PruneDuty is the fraction of the prune's time spent deleting
	// (admin.PruneOptions.Duty). Default admin.DefaultPruneDuty.
	PruneDuty float64
	// ProviderDelay is how long the fake payment provider of
	// LeasedScenario takes to answer each charge. Default 300ms.
	ProviderDelay time.Duration
	// Pool is the size of LeasedScenario's Postgres pool (pool_max_conns),
	// unless Store sets its own pool_max_conns. Default 10.
	Pool int
	// Progress receives progress lines; nil is quiet.
	Progress io.Writer

	// leasedN is N for LeasedScenario: N when it was given, else
	// defaultLeasedN.
	leasedN int
}

// defaultLeasedN is LeasedScenario's N when Config.N is not given.
const defaultLeasedN = 3000

// withDefaults fills in defaults and checks every field, naming the field
// in the error.
func (c Config) withDefaults() (Config, error) {
	if c.Broker == "" {
		return c, fmt.Errorf("benchmark: Config.Broker is required (e.g. amqp://guest:guest@127.0.0.1:5672/?queue=bench)")
	}
	if c.Store == "" {
		return c, fmt.Errorf("benchmark: Config.Store is required (e.g. postgres://postgres@127.0.0.1:5432/test)")
	}
	bu, err := url.Parse(c.Broker)
	if err != nil {
		return c, fmt.Errorf("benchmark: Config.Broker: not a URL")
	}
	switch bu.Scheme {
	case "amqp", "amqps", "kafka", "sqs", "pubsub", "nats", "redis", "rediss":
	default:
		return c, fmt.Errorf("benchmark: Config.Broker: scheme %q is not supported (%s)", bu.Scheme, BrokerSchemes)
	}
	su, err := url.Parse(c.Store)
	if err != nil {
		return c, fmt.Errorf("benchmark: Config.Store: not a URL")
	}
	switch su.Scheme {
	case "postgres", "postgresql", "mysql":
	default:
		return c, fmt.Errorf("benchmark: Config.Store: scheme %q is not supported (%s)", su.Scheme, StoreSchemes)
	}
	c.leasedN = c.N
	if c.N == 0 {
		c.N, c.leasedN = 50_000, defaultLeasedN
	}
	if c.N < 1 || c.N > 100_000_000 {
		return c, fmt.Errorf("benchmark: Config.N: %d is outside 1..100000000", c.N)
	}
	switch {
	case c.Duplicates == 0:
		c.Duplicates = 0.2
	case c.Duplicates < 0:
		c.Duplicates = 0
	case c.Duplicates > 10:
		return c, fmt.Errorf("benchmark: Config.Duplicates: %v is above 10", c.Duplicates)
	}
	if c.Accounts == 0 {
		c.Accounts = 1000
	}
	if c.Accounts < 1 || c.Accounts > 10_000_000 {
		return c, fmt.Errorf("benchmark: Config.Accounts: %d is outside 1..10000000", c.Accounts)
	}
	maxBatch := 10_000
	switch bu.Scheme {
	case "sqs":
		maxBatch = sqsMaxBatch // ReceiveMessage and DeleteMessageBatch take at most 10
	case "pubsub":
		maxBatch = pubsubMaxBatch // a Pull returns at most 1,000
	}
	if c.BatchSize == 0 {
		c.BatchSize = min(200, maxBatch)
	}
	if c.BatchSize < 1 || c.BatchSize > maxBatch {
		return c, fmt.Errorf("benchmark: Config.BatchSize: %d is outside 1..%d (for %s://)", c.BatchSize, maxBatch, bu.Scheme)
	}
	if c.BatchWorkers == 0 {
		c.BatchWorkers = 1
	}
	if c.BatchWorkers < 1 || c.BatchWorkers > 64 {
		return c, fmt.Errorf("benchmark: Config.BatchWorkers: %d is outside 1..64", c.BatchWorkers)
	}
	if c.Repeat == 0 {
		c.Repeat = 3
	}
	if c.Repeat < 1 || c.Repeat > 100 {
		return c, fmt.Errorf("benchmark: Config.Repeat: %d is outside 1..100", c.Repeat)
	}
	if c.LatencyRate == 0 {
		c.LatencyRate = 200
	}
	if c.LatencyRate < 1 || c.LatencyRate > 100_000 {
		return c, fmt.Errorf("benchmark: Config.LatencyRate: %d is outside 1..100000", c.LatencyRate)
	}
	if c.LatencyMessages == 0 {
		c.LatencyMessages = 1000
	}
	if c.LatencyMessages < 1 || c.LatencyMessages > 1_000_000 {
		return c, fmt.Errorf("benchmark: Config.LatencyMessages: %d is outside 1..1000000", c.LatencyMessages)
	}
	if c.GrowthRows == 0 {
		c.GrowthRows = 10_000_000
	}
	if c.GrowthRows < 1 || c.GrowthRows > 1_000_000_000 {
		return c, fmt.Errorf("benchmark: Config.GrowthRows: %d is outside 1..1000000000", c.GrowthRows)
	}
	if c.PruneBatch == 0 {
		c.PruneBatch = 1000
	}
	if c.PruneBatch < 1 || c.PruneBatch > 1_000_000 {
		return c, fmt.Errorf("benchmark: Config.PruneBatch: %d is outside 1..1000000", c.PruneBatch)
	}
	if c.PruneDuty == 0 {
		c.PruneDuty = admin.DefaultPruneDuty
	}
	if !(c.PruneDuty > 0 && c.PruneDuty <= 1) {
		return c, fmt.Errorf("benchmark: Config.PruneDuty: %v is outside (0, 1]", c.PruneDuty)
	}
	if c.ProviderDelay == 0 {
		c.ProviderDelay = 300 * time.Millisecond
	}
	if c.ProviderDelay < 0 || c.ProviderDelay > time.Minute {
		return c, fmt.Errorf("benchmark: Config.ProviderDelay: %v is outside 0..1m", c.ProviderDelay)
	}
	if c.Pool == 0 {
		c.Pool = 10
	}
	if c.Pool < 1 || c.Pool > 1000 {
		return c, fmt.Errorf("benchmark: Config.Pool: %d is outside 1..1000", c.Pool)
	}
	if len(c.Configs) == 0 {
		c.Configs = slices.Clone(DefaultConfigs)
	}
	seen := map[string]bool{}
	for _, name := range c.Configs {
		if !slices.Contains(DefaultConfigs, name) && !slices.Contains(Scenarios, name) && !slices.Contains(ObservedConfigs, name) && !slices.Contains(FrameworkConfigs, name) && !slices.Contains(KafkaConfigs, name) {
			return c, fmt.Errorf("benchmark: Config.Configs: unknown configuration %q (known: %s)", name, strings.Join(slices.Concat(DefaultConfigs, ObservedConfigs, FrameworkConfigs, KafkaConfigs, Scenarios), ", "))
		}
		if seen[name] {
			return c, fmt.Errorf("benchmark: Config.Configs: %q given twice", name)
		}
		seen[name] = true
	}
	return c, nil
}

// duplicates is the number of extra (duplicate) deliveries per run.
func (c Config) duplicates() int { return c.duplicatesOf(c.N) }

// duplicatesOf is the number of extra deliveries of a run of n unique
// messages.
func (c Config) duplicatesOf(n int) int { return int(float64(n)*c.Duplicates + 0.5) }

// Describe returns a one-line description of a configuration name, for
// help texts and the report.
func Describe(name string) string {
	switch name {
	case SeedP5:
		return "seed pattern (raw drivers): 1 tx per message, prefetch 5, 1 worker"
	case SeedP100W8:
		return "seed pattern (raw drivers): 1 tx per message, prefetch 100, 8 workers"
	case HandBatch:
		return "hand-tuned batch (raw drivers): 1 claim + 1 set-based UPDATE + 1 commit + 1 multiple ack per batch"
	case RawAck:
		return "broker only: consume + multiple ack per batch, no database"
	case IdemqB1W5:
		return "idemq batch size 1, window 5, 1 worker"
	case IdemqB1W100C8:
		return "idemq batch size 1, window 100, 8 workers"
	case IdemqQueue:
		return "idemq batch mode, per-message handler with postgres.Queue, IsolateReplay"
	case IdemqBatch:
		return "idemq batch mode, core.NewBatch set-based BatchHandler"
	case IdemqBatchObserved:
		return "idemq-batch with tracing (every span) and metrics observers on the OTel SDK"
	case IdemqBatchSampled:
		return "idemq-batch with tracing (10% of traces) and metrics observers on the OTel SDK"
	case Watermill:
		return fmt.Sprintf("seed pattern on Watermill (Router + watermill-amqp): 1 tx per message, prefetch %d, %d handlers", watermillPrefetch, watermillHandlers)
	case SeedFranz:
		return "seed pattern (raw franz-go): 1 tx per message, then a synchronous offset commit; 8 group members"
	case HandBatchFranz:
		return "hand-tuned batch (raw franz-go): 1 claim + 1 set-based UPDATE + 1 commit + 1 synchronous offset commit per poll"
	case MemoryScenario:
		return "idemq batch: peak RSS with 10k vs 1M messages queued"
	case GrowthScenario:
		return "idemq batch: 10M rows in the dedup table vs empty; p99 while pruning them"
	case LeasedScenario:
		return "a slow provider call per message: inside the dedup transaction (core.New) vs outside it under a lease (core.NewLeased)"
	}
	return ""
}
