// Command payments is idemq's reference service: a payment consumer a team
// can copy. The broker and the store are chosen by URL at start-up, so the
// same binary serves RabbitMQ, Kafka, SQS, Google Cloud Pub/Sub, NATS
// JetStream, Redis Streams, signed webhooks (or the in-process mem://) into PostgreSQL,
// MySQL/MariaDB or SQLite, and its handlers never mention a broker.
//
//	go run ./examples/payments --broker 'amqp://guest:guest@localhost:5672/?queue=payments' \
//	    --store 'postgres://postgres@localhost:5432/test'
//	go run ./examples/payments --broker 'kafka://localhost:9092/payments?group=payments' --store …
//	go run ./examples/payments --broker 'sqs://payments?endpoint=http://localhost:9324&region=us-east-1' --store …
//	go run ./examples/payments --broker 'redis://localhost:6379/payments?group=payments' --store …
//	PUBSUB_EMULATOR_HOST=localhost:8085 go run ./examples/payments --broker 'pubsub://my-project/payments?topic=payments' --store …
//	go run ./examples/payments --broker 'webhook://127.0.0.1:8080/hooks/payments?verify=standard&secret_file=/run/secrets/payments&park_dir=/var/lib/payments/parked' --store …
//
// Each message's body is JSON like {"account": "acc-17", "amount_cents": 1250};
// its id is the producer's business id (the AMQP message_id property, the
// Kafka header or SQS or Pub/Sub message attribute "message-id", the Nats-Msg-Id
// header or idemq-id, the idemq-id field of a Redis entry, a webhook's
// webhook-id header). In one transaction
// per message (or per batch, --batch) the service claims the id, inserts a
// row into ledger(account, amount_cents, message_id) — a table with no
// unique constraint, so only idemq stands between a duplicate and a double
// charge — and adds the amount to accounts(account, balance_cents). It
// creates its tables on start, logs every decision, stops gracefully on
// SIGTERM or SIGINT (in-flight messages finish, the rest stay unacked), and
// may be killed with SIGKILL at any moment: the broker redelivers what was
// not acknowledged and the claim turns what was already committed into a
// Duplicate.
//
// With a webhook:// broker the service is an HTTP endpoint (package
// brokers/webhook): each POST signed with Standard Webhooks (webhook-id,
// webhook-timestamp, webhook-signature: v1,<base64 HMAC-SHA256 of
// "id.timestamp.body"> under the whsec_ secret of secret_file) is one
// payment, answered 200 only once it was committed, a copy in flight
// waits for the first copy's answer, and a payment the service cannot
// apply is parked in park_dir and answered 200. The sender retries
// anything else; after a crash its next copy is applied or answered 200
// as a Duplicate. Senders post concurrently and the service decides one
// request at a time by default: give it --batch or --concurrency near the
// requests expected at once. A webhook inbox has nothing to publish to:
// --publish refuses it, and tests or a shell send the requests themselves:
//
//	secret=whsec_$(head -c 24 /dev/urandom | base64) && echo "$secret" > secret && mkdir -p parked
//	go run ./examples/payments --store sqlite://payments.db \
//	    --broker "webhook://127.0.0.1:8080/hooks/payments?verify=standard&secret_file=$PWD/secret&park_dir=$PWD/parked" &
//	id=evt_1 ts=$(date +%s) body='{"account":"acc-17","amount_cents":1250}'
//	sig=$(printf '%s' "$id.$ts.$body" | openssl dgst -sha256 -mac HMAC \
//	    -macopt hexkey:$(printf '%s' "${secret#whsec_}" | base64 -d | od -An -vtx1 | tr -d ' \n') -binary | base64)
//	curl -i http://127.0.0.1:8080/hooks/payments -H "webhook-id: $id" -H "webhook-timestamp: $ts" \
//	    -H "webhook-signature: v1,$sig" -d "$body"
//
// With --provider the service charges each payment through a payment
// provider's HTTP API before booking it (the leased mode, core.NewLeased):
// the charge runs outside any transaction under a leased claim, with an
// Idempotency-Key derived from the message id and $PAYMENTS_KEY_SECRET, so
// a slow provider holds no database connection and a charge repeated after
// a crash is answered with the first one. Up to --window charges run at
// once.
//
//	PAYMENTS_KEY_SECRET=… go run ./examples/payments --broker URL --store URL --provider https://pay.example/v1
//
//	go run ./examples/payments --broker URL --store URL --publish 20000 --duplicates 0.2 --seed 7
//
// publishes test traffic to the same broker URL instead (deterministic
// from the seed: a test can compute every expected balance) and exits.
//
// Exit codes: 0 on a clean stop (or a complete --publish), 1 on failure, 2
// on bad flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/logging"
	"github.com/idemq/idemq/middleware/tracing"

	// Every broker adapter and store registers its URL scheme: the
	// deployment's URLs, not this code, pick them.
	_ "github.com/idemq/idemq/brokers/kafka"
	_ "github.com/idemq/idemq/brokers/memory"
	natsbroker "github.com/idemq/idemq/brokers/nats"
	_ "github.com/idemq/idemq/brokers/pubsub"
	_ "github.com/idemq/idemq/brokers/rabbitmq"
	_ "github.com/idemq/idemq/brokers/redis"
	_ "github.com/idemq/idemq/brokers/sqs"
	_ "github.com/idemq/idemq/brokers/webhook"
)

// settings are the parsed command-line flags.
type settings struct {
	broker, store, consumer, tables string
	batch, concurrency              int
	shutdown, txnTimeout            time.Duration
	logLevel                        slog.Level
	publish                         int
	duplicates                      float64
	seed                            uint64
	accounts                        int
	rejectAbove                     int64
	provider                        string
	lease                           time.Duration
	window                          int
	metrics                         string
}

func main() {
	s, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: s.logLevel}))
	// Stores opened by URL, and client libraries, log to slog.Default().
	slog.SetDefault(logger)
	// SIGTERM/SIGINT cancel ctx: the consumer stops receiving, finishes
	// what it holds within --shutdown-timeout and leaves the rest unacked.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// W3C trace context on every published message, continuing the trace
	// this process was started in (TRACEPARENT), if any.
	ctx = tracing.InstallPropagator(ctx)
	if s.publish > 0 {
		err = publish(ctx, s, os.Stdout)
	} else {
		err = serve(ctx, s, logger)
	}
	if err != nil {
		// Errors from opening URLs are already redacted by core; redact
		// again in case a driver error quoted a URL.
		msg := core.RedactError(err, s.broker)
		msg = core.RedactError(errors.New(msg), s.store)
		logger.Error("payments: " + msg)
		os.Exit(1)
	}
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,40}$`)

func parseFlags(args []string, stderr io.Writer) (settings, error) {
	fs := flag.NewFlagSet("payments", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var s settings
	level := "info"
	fs.StringVar(&s.broker, "broker", "", "broker URL: amqp://…?queue=Q, kafka://host:port/topic?group=G, sqs://queue?…, nats://host:4222/STREAM?consumer=C&subject=S, redis://host:6379/STREAM?group=G, webhook://127.0.0.1:8080/PATH?verify=standard&secret_file=F&park_dir=D, mem://queue (required)")
	fs.StringVar(&s.store, "store", "", "store URL: postgres://…, mysql://…, sqlite://path (required; ?table= names the dedup table)")
	fs.StringVar(&s.consumer, "consumer", "payments", "consumer name: the first half of the dedup key")
	fs.StringVar(&s.tables, "tables", "", "prefix for the ledger and accounts tables (letters, digits, _)")
	fs.IntVar(&s.batch, "batch", 1, "messages per transaction (1: one transaction per message)")
	fs.IntVar(&s.concurrency, "concurrency", 1, "batches processed at once, each in its own transaction")
	fs.DurationVar(&s.shutdown, "shutdown-timeout", 10*time.Second, "on SIGTERM/SIGINT, how long in-flight messages may take before they are rolled back and left unacked")
	fs.DurationVar(&s.txnTimeout, "txn-timeout", time.Minute, "bound on one transaction, its handler included: a database connection that went half-open is given up after it")
	fs.Int64Var(&s.rejectAbove, "reject-above", 0, "dead-letter payments of more than this many cents, as a limit set by mistake would (0: no limit); the incident drill in docs/operating.md")
	fs.StringVar(&s.provider, "provider", "", "payment provider URL: charge each payment through its HTTP API (POST /charges with an Idempotency-Key from $"+keySecretEnv+") outside any transaction, under a leased claim, then book it (the leased mode)")
	fs.DurationVar(&s.lease, "lease", 30*time.Second, "with --provider: how long a payment's claim in progress stays this process's without renewal; a crashed process's payments are taken over after it")
	fs.StringVar(&s.metrics, "metrics", "", "host:port to serve the consumer's metrics on for Prometheus (GET /metrics; docs/dashboards/idemq.json charts them); default none")
	fs.IntVar(&s.window, "window", 500, "with --provider: payments in flight at once (charges running concurrently)")
	fs.StringVar(&level, "log-level", level, "debug, info, warn or error; each decision is logged at info (duplicate: info, retry: warn, dead letter: error)")
	fs.IntVar(&s.publish, "publish", 0, "publish N test messages (duplicates included) to --broker and exit, instead of consuming (not to a webhook:// inbox: its sender publishes)")
	fs.Float64Var(&s.duplicates, "duplicates", 0.2, "with --publish: fraction of the N messages that repeat an earlier message (same id, same body)")
	fs.Uint64Var(&s.seed, "seed", 1, "with --publish: seed of the traffic (ids, accounts and amounts follow from it)")
	fs.IntVar(&s.accounts, "accounts", 50, "with --publish: accounts the payments spread over")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: payments --broker URL --store URL [--consumer NAME] [flags]
       payments --broker URL --publish N [--duplicates 0.2] [--seed S]

Consumes payment messages exactly once into a ledger and account balances,
or (--publish) produces test traffic. Credentials in URLs are never logged.

With --broker webhook://HOST:PORT/PATH?verify=standard&secret_file=F&park_dir=D
the service serves HTTP: each signed POST (Standard Webhooks; the event id
in webhook-id) is a payment, answered 200 once committed. Nothing can be
published to such an inbox: --publish refuses it.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := s.logLevel.UnmarshalText([]byte(level)); err != nil {
		return s, fmt.Errorf("--log-level: %q is not debug, info, warn or error", level)
	}
	switch {
	case s.broker == "":
		return s, errors.New("--broker: required")
	case s.store == "" && s.publish == 0:
		return s, errors.New("--store: required (unless --publish)")
	case s.consumer == "":
		return s, errors.New("--consumer: must not be empty")
	case s.tables != "" && !identifier.MatchString(s.tables):
		return s, fmt.Errorf("--tables: %q is not a table name prefix (letters, digits, _; at most 41)", s.tables)
	case s.batch < 1 || s.batch > 1000:
		return s, fmt.Errorf("--batch: %d must be from 1 to 1000", s.batch)
	case s.concurrency < 1:
		return s, fmt.Errorf("--concurrency: %d must be at least 1", s.concurrency)
	case s.shutdown <= 0:
		return s, fmt.Errorf("--shutdown-timeout: %v must be positive", s.shutdown)
	case s.publish < 0:
		return s, fmt.Errorf("--publish: %d must not be negative", s.publish)
	case !(s.duplicates >= 0 && s.duplicates < 1):
		return s, fmt.Errorf("--duplicates: %v is not a fraction in [0, 1)", s.duplicates)
	case s.accounts < 1:
		return s, fmt.Errorf("--accounts: %d must be at least 1", s.accounts)
	case s.publish > 0 && pushBroker(s.broker):
		return s, errPushPublish
	case s.provider == "" && (flagSet(fs, "lease") || flagSet(fs, "window")):
		return s, errNoProvider
	case s.lease < 100*time.Millisecond:
		return s, fmt.Errorf("--lease: %v must be at least 100ms", s.lease)
	case s.window < 1:
		return s, fmt.Errorf("--window: %d must be at least 1", s.window)
	}
	if s.provider != "" {
		if u, err := url.Parse(s.provider); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return s, fmt.Errorf("--provider: %q is not an http:// or https:// URL", s.provider)
		}
	}
	if s.store != "" {
		if _, err := dialectOf(s.store); err != nil {
			return s, fmt.Errorf("--store: %w", err)
		}
	}
	return s, nil
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// payment is a message body.
type payment struct {
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
}

// decode reads a body; a body that can never be applied is a permanent
// error (dead-lettered at once, with the cause), not a retry.
// maxAmountCents bounds one payment (±10^15 cents) so that sums over any
// batch stay far from int64 overflow.
const maxAmountCents = 1_000_000_000_000_000

func decode(body []byte) (payment, error) {
	var p payment
	if err := json.Unmarshal(body, &p); err != nil {
		return p, core.Permanent(fmt.Errorf("payment body: %w", err))
	}
	if p.Account == "" || len(p.Account) > 255 {
		return p, core.Permanent(errors.New("payment body: account must be 1 to 255 bytes"))
	}
	if !utf8.ValidString(p.Account) || strings.ContainsRune(p.Account, 0) {
		// Postgres refuses NUL in text: decided here, not after retries.
		return p, core.Permanent(errors.New("payment body: account must be valid UTF-8 without NUL"))
	}
	if p.AmountCents == 0 || p.AmountCents > maxAmountCents || p.AmountCents < -maxAmountCents {
		return p, core.Permanent(fmt.Errorf("payment body: amount_cents must be non-zero and within ±%d", int64(maxAmountCents)))
	}
	return p, nil
}

// serve opens the store and the broker by URL and runs the consumer until
// ctx is cancelled.
func serve(ctx context.Context, s settings, logger *slog.Logger) error {
	logger.Info("payments: starting", "broker", core.Redact(s.broker), "store", core.Redact(s.store),
		"consumer", s.consumer, "batch", s.batch, "concurrency", s.concurrency)
	d, _ := dialectOf(s.store)
	if d == dialectPostgres {
		b, err := openPostgres(ctx, s)
		if err != nil {
			return err
		}
		defer b.close()
		return consume(ctx, s, logger, b)
	}
	b, err := openSQL(ctx, s, d)
	if err != nil {
		return err
	}
	defer b.close()
	return consume(ctx, s, logger, b)
}

// consume is the broker-neutral part: it works for every store through its
// transaction type Tx and for every broker through driver.Source.
func consume[Tx any](ctx context.Context, s settings, logger *slog.Logger, b *backend[Tx]) error {
	src, err := core.OpenSource(ctx, s.broker, core.WithAdapterLogger(logger))
	if err != nil {
		return err
	}
	charge := b.charge
	if limit := s.rejectAbove; limit > 0 {
		charge = func(ctx context.Context, tx Tx, msgs []*core.Message) error {
			for _, m := range msgs {
				if p, err := decode(m.Body); err == nil && p.AmountCents > limit {
					return core.Permanent(fmt.Errorf("payment %s: amount_cents %d above the limit %d", m.ID, p.AmountCents, limit))
				}
			}
			return b.charge(ctx, tx, msgs)
		}
	}
	logs, err := logging.New(logger, logging.WithLevel(core.Processed, slog.LevelInfo))
	if err != nil {
		src.Close()
		return err
	}
	opts := []core.Option{
		core.WithName(s.consumer),
		core.WithBatchSize(s.batch),
		core.WithConcurrency(s.concurrency),
		core.WithShutdownTimeout(s.shutdown),
		core.WithTransactionTimeout(s.txnTimeout),
		core.WithLogger(logger),
		core.WithObserver(logs),
	}
	kill, err := newKiller(logger)
	if err != nil {
		src.Close()
		return err
	}
	if kill != nil {
		opts = append(opts, core.WithObserver(kill))
	}
	if s.metrics != "" {
		m, err := serveMetrics(ctx, s.metrics, logger)
		if err != nil {
			src.Close()
			return err
		}
		opts = append(opts, core.WithObserver(m))
	}
	var c *core.Consumer[Tx]
	if s.provider != "" {
		// The leased mode: the charge is an HTTP call that holds no
		// transaction; the booking commits with the claim after it.
		var p *provider
		if p, err = newProvider(s.provider); err == nil {
			c, err = core.NewLeased(src, b.store, core.LeasedHandler[Tx, string]{
				External: p.charge,
				Complete: b.book,
				Lease:    s.lease,
			}, append(opts, core.WithWindow(max(s.window, s.batch)))...)
		}
	} else {
		c, err = core.NewBatch(src, b.store, charge, opts...)
	}
	if err != nil {
		src.Close()
		return err
	}
	err = c.Run(ctx)
	st := c.Stats()
	logger.Info("payments: stopped", "received", st.Received, "processed", st.Processed, "duplicates", st.Duplicates,
		"retried", st.Retried, "held_back", st.HeldBack, "dead_lettered", st.DeadLettered, "unsettled", st.Unsettled,
		"store_outages", st.StoreOutages, "store_retries", st.StoreRetries)
	return err
}

// publish sends s.publish messages, s.duplicates of them repeats of earlier
// ones, to the broker URL.
func publish(ctx context.Context, s settings, out io.Writer) error {
	// Opening the consumer side first declares what the broker needs (the
	// RabbitMQ queue, the Redis stream's consumer group; Kafka and SQS
	// check that the topic or queue exists), so no published message is
	// unroutable.
	src, err := core.OpenSource(ctx, s.broker)
	if err != nil {
		return err
	}
	src.Close()
	pub, err := core.OpenPublisher(ctx, s.broker)
	if err != nil {
		return err
	}
	defer pub.Close()
	sends, unique := traffic(s.seed, s.publish, s.duplicates, s.accounts)
	if err := publishSends(ctx, pub, sends, natsBroker(s.broker)); err != nil {
		return err
	}
	fmt.Fprintf(out, "published %d messages to %s: %d unique payments, %d duplicates (seed %d)\n",
		len(sends), core.Redact(s.broker), len(unique), len(sends)-len(unique), s.seed)
	return nil
}

// publishSends publishes payments in order, 500 to a call. With copyIDs
// (NATS) a repeat of an earlier payment carries a message id of its own
// (ID/dup-POSITION) and the business id in the idemq-id header, which the
// NATS source reads first: JetStream drops a publish whose Nats-Msg-Id it
// saw within the stream's duplicate window (2 minutes), so a repeat with
// the original's id would never reach a consumer, unlike a producer's
// retry sent after that window. Redis keeps every XADD, so a repeat there
// is an entry of its own with the original's id, as a producer's retry
// would be.
func publishSends(ctx context.Context, pub *core.Publisher, sends []sent, copyIDs bool) error {
	const chunk = 500
	seen := map[string]bool{}
	for start := 0; start < len(sends); start += chunk {
		end := min(start+chunk, len(sends))
		msgs := make([]*core.Message, 0, end-start)
		for i, p := range sends[start:end] {
			body, _ := json.Marshal(p.payment)
			m := &core.Message{ID: p.id, Body: body, Key: p.Account}
			if copyIDs && seen[p.id] {
				m.ID = fmt.Sprintf("%s/dup-%d", p.id, start+i)
				m.Headers = map[string]string{natsbroker.IDHeader: p.id}
			}
			seen[p.id] = true
			msgs = append(msgs, m)
		}
		if err := pub.Publish(ctx, "", msgs...); err != nil {
			return fmt.Errorf("publishing messages %d to %d: %w", start, end-1, err)
		}
	}
	return nil
}

// pushBroker tells whether brokerURL is an inbox its senders push to
// (webhook://): the service serves it and has nothing to publish to it.
func pushBroker(brokerURL string) bool {
	return strings.HasPrefix(strings.ToLower(brokerURL), "webhook://")
}

var errPushPublish = errors.New("--publish: a webhook:// broker is an HTTP inbox the webhook sender posts to; there is nothing to publish to: send signed requests to it instead")

// natsBroker tells whether brokerURL is a NATS JetStream stream.
func natsBroker(brokerURL string) bool {
	return strings.HasPrefix(strings.ToLower(brokerURL), "nats://")
}

// sent is one published payment with its business id.
type sent struct {
	id string
	payment
}

// traffic returns the n messages --publish sends, in order, and the unique
// payments among them. It depends on its arguments alone, so a test
// computes the expected balances from the same seed.
func traffic(seed uint64, n int, duplicates float64, accounts int) (sends, unique []sent) {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	for range n {
		if len(unique) > 0 && rng.Float64() < duplicates {
			// A repeat of a recent message, as a producer retry would send.
			back := min(len(unique), 500)
			sends = append(sends, unique[len(unique)-1-rng.IntN(back)])
			continue
		}
		p := sent{
			id: fmt.Sprintf("pay-%d-%07d", seed, len(unique)),
			payment: payment{
				Account:     fmt.Sprintf("acc-%d", rng.IntN(accounts)),
				AmountCents: 1 + rng.Int64N(100_000),
			},
		}
		unique = append(unique, p)
		sends = append(sends, p)
	}
	return sends, unique
}

type dialect int

const (
	dialectPostgres dialect = iota + 1
	dialectMySQL
	dialectSQLite
)

// dialectOf tells the store's SQL dialect from its URL scheme.
func dialectOf(storeURL string) (dialect, error) {
	u, err := url.Parse(storeURL)
	if err != nil {
		// Not quoted, not even redacted: no rule knows where a malformed
		// URL's password ends.
		return 0, errors.New("the store URL does not parse (percent-encode '@', ':', '/', '?', '#' and '%' in its password)")
	}
	switch strings.ToLower(u.Scheme) {
	case "postgres", "postgresql":
		return dialectPostgres, nil
	case "mysql":
		return dialectMySQL, nil
	case "sqlite":
		return dialectSQLite, nil
	}
	return 0, fmt.Errorf("scheme %q: this service has handlers for postgres://, mysql:// and sqlite://", u.Scheme)
}
