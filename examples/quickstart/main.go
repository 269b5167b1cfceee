// Command quickstart shows idemq's promise with no services at all: it
// publishes payment messages to the in-process memory broker with duplicate
// publishes, lost acks, crashes between commit and ack and failing handlers,
// consumes them into account balances in SQLite, and checks that every
// balance is exactly what the unique payments add up to. With -outbox it
// shows the producing side too: payment requests and their messages commit
// together in the producer's SQLite file (outbox/sqliteoutbox), and a relay
// whose confirms get lost publishes them, copies included.
//
//	go run ./examples/quickstart            # batch sizes 1 and 100
//	go run ./examples/quickstart -outbox    # produced through the SQLite outbox
//	go run ./examples/quickstart --help     # all flags
//
// It exits 1 if any invariant is broken (an effect applied twice, a message
// lost), 2 on bad flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemq/idemq/internal/drain"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/recovery"
)

type settings struct {
	messages      int
	duplicates    float64
	loseAcks      float64
	crashes       float64
	handlerErrors float64
	accounts      int
	batchSizes    []int
	concurrency   int
	visibility    time.Duration
	seed          uint64
	dir           string
	store         string
	keep          bool
	progress      bool
	outbox        bool
	loseConfirms  float64
}

func main() {
	s, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(2)
	}
	ok, err := run(context.Background(), s, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (settings, error) {
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	s := settings{}
	batches := fs.String("batch", "1,100", "comma-separated batch sizes; each runs on a fresh broker and database")
	fs.IntVar(&s.messages, "n", 10000, "unique payment messages to publish")
	fs.Float64Var(&s.duplicates, "duplicates", 0.2, "fraction of publishes the broker enqueues twice")
	fs.Float64Var(&s.loseAcks, "lose-acks", 0.01, "fraction of acks the broker silently loses (redelivered after the visibility timeout)")
	fs.Float64Var(&s.crashes, "crashes", 0.002, "fraction of acks replaced by a consumer crash between commit and ack")
	fs.Float64Var(&s.handlerErrors, "handler-errors", 0.01, "fraction of messages whose handler fails on the first attempt")
	fs.IntVar(&s.accounts, "accounts", 100, "number of accounts the payments spread over")
	fs.IntVar(&s.concurrency, "concurrency", 1, "batches processed at once")
	fs.DurationVar(&s.visibility, "visibility", time.Second, "how long an unacknowledged delivery stays leased before redelivery")
	fs.Uint64Var(&s.seed, "seed", 1, "seed for payments and injected faults (a run is reproducible from it)")
	fs.StringVar(&s.dir, "dir", "", "directory for the SQLite files (default: a temporary directory, removed afterwards)")
	fs.StringVar(&s.store, "store", "", "store URL: postgres://…, mysql://… or sqlite://path (default: a fresh SQLite file per run); each run gets its own tables and consumer name")
	fs.BoolVar(&s.keep, "keep-tables", false, "keep each run's accounts and ledger tables on a --store database")
	fs.BoolVar(&s.outbox, "outbox", false, "produce through a transactional outbox: payment requests and their messages commit together in the producer's SQLite file, and a relay publishes them")
	fs.Float64Var(&s.loseConfirms, "lose-confirms", 0.05, "with -outbox: fraction of the relay's publishes whose confirm is lost (the relay publishes those messages again)")
	fs.BoolVar(&s.progress, "progress", term.IsTerminal(int(os.Stderr.Fd())), "show a progress bar on stderr (default: when stderr is a terminal)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: quickstart [flags]\n\nPublishes payments with injected faults to the in-process broker, consumes them\nexactly once into SQLite balances, and checks every balance.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, f := range strings.Split(*batches, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return s, fmt.Errorf("-batch: %q is not a positive batch size", f)
		}
		s.batchSizes = append(s.batchSizes, n)
	}
	for name, p := range map[string]float64{"-duplicates": s.duplicates, "-lose-acks": s.loseAcks, "-crashes": s.crashes, "-handler-errors": s.handlerErrors, "-lose-confirms": s.loseConfirms} {
		if !(p >= 0 && p <= 1) {
			return s, fmt.Errorf("%s: %v is not a fraction in [0, 1]", name, p)
		}
	}
	switch {
	case s.messages < 1:
		return s, fmt.Errorf("-n: %d must be at least 1", s.messages)
	case s.accounts < 1:
		return s, fmt.Errorf("-accounts: %d must be at least 1", s.accounts)
	case s.concurrency < 1:
		return s, fmt.Errorf("-concurrency: %d must be at least 1", s.concurrency)
	case s.visibility <= 0:
		return s, fmt.Errorf("-visibility: %v must be positive", s.visibility)
	}
	return s, nil
}

// result is one run's row in the table.
type result struct {
	batch                                          int
	published, received, processed, duplicates     int64
	retried, deadLettered, crashes, settleErrors   int64
	wall                                           time.Duration
	ledgerRows, doubleApplied, wrongBalances, lost int
	producer                                       *producerResult
}

func (r result) ok() bool {
	return r.doubleApplied == 0 && r.wrongBalances == 0 && r.lost == 0 && r.deadLettered == 0
}

func run(ctx context.Context, s settings, out io.Writer) (bool, error) {
	dir := s.dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "idemq-quickstart-")
		if err != nil {
			return false, err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
		s.dir = dir
	}
	payments := makePayments(s)
	where := "SQLite"
	if s.store != "" {
		where = core.Redact(s.store)
	}
	from := ""
	if s.outbox {
		from = fmt.Sprintf(", produced through an SQLite outbox (%.0f%% of relay publishes lose their confirm)", 100*s.loseConfirms)
	}
	fmt.Fprintf(out, "idemq quickstart into %s: %d payments over %d accounts%s; faults: %.0f%% duplicate publishes, %.1f%% lost acks, %.1f%% crashes between commit and ack, %.1f%% failing handlers (seed %d)\n\n",
		where, s.messages, s.accounts, from, 100*s.duplicates, 100*s.loseAcks, 100*s.crashes, 100*s.handlerErrors, s.seed)
	var results []result
	for _, b := range s.batchSizes {
		r, err := runStore(ctx, s, b, payments, storeURL(s, dir, b))
		if err != nil {
			return false, fmt.Errorf("batch size %d: %w", b, err)
		}
		results = append(results, r)
	}
	printTable(out, results)
	allOK := true
	for _, r := range results {
		allOK = allOK && r.ok()
	}
	if allOK {
		fmt.Fprintln(out, "\nOK: every account balance equals the expected one; every payment was applied exactly once; nothing was lost.")
	} else {
		fmt.Fprintln(out, "\nFAILED: an invariant is broken (see the last rows of the table).")
	}
	return allOK, nil
}

type payment struct {
	ID      string `json:"-"`
	Account string `json:"account"`
	Amount  int64  `json:"amount_cents"`
}

func makePayments(s settings) []payment {
	rng := rand.New(rand.NewPCG(s.seed, 0x9e3779b97f4a7c15))
	ps := make([]payment, s.messages)
	for i := range ps {
		ps[i] = payment{
			ID:      fmt.Sprintf("pay-%07d", i),
			Account: fmt.Sprintf("acc-%d", rng.IntN(s.accounts)),
			Amount:  1 + rng.Int64N(100_000),
		}
	}
	return ps
}

// failsFirstTime decides, from the seed and the id alone, whether a
// message's handler fails on its first attempt, so reruns are reproducible.
func failsFirstTime(seed uint64, id string, rate float64) bool {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", seed, id)
	return float64(h.Sum64()%1_000_000) < rate*1_000_000
}

// runStore opens the store of one run and runs it with the handler for the
// store's transaction type.
func runStore(ctx context.Context, s settings, batch int, payments []payment, url string) (result, error) {
	if strings.HasPrefix(url, "postgres:") || strings.HasPrefix(url, "postgresql:") {
		b, err := openPostgres(ctx, url, s.keep)
		if err != nil {
			return result{batch: batch}, err
		}
		defer b.close()
		return runOnce(ctx, s, batch, payments, b)
	}
	b, err := openSQL(ctx, url, s.keep)
	if err != nil {
		return result{batch: batch}, err
	}
	defer b.close()
	return runOnce(ctx, s, batch, payments, b)
}

func runOnce[Tx any](ctx context.Context, s settings, batch int, payments []payment, be *backend[Tx]) (result, error) {
	r := result{batch: batch}
	broker, err := memory.NewBroker(memory.WithSeed(s.seed), memory.WithVisibilityTimeout(s.visibility),
		memory.WithFaults(memory.Faults{DuplicatePublish: s.duplicates}))
	if err != nil {
		return r, err
	}
	defer broker.Close()
	const queue = "payments"
	if s.outbox {
		pr, err := produce(ctx, s, s.dir, batch, payments, queue, broker)
		if err != nil {
			return r, fmt.Errorf("outbox: %w", err)
		}
		r.producer = &pr
	} else {
		msgs := make([]*core.Message, len(payments))
		for i, p := range payments {
			body, _ := json.Marshal(p)
			msgs[i] = &core.Message{ID: p.ID, Body: body}
		}
		if err := core.NewPublisher(broker).Publish(ctx, queue, msgs...); err != nil {
			return r, err
		}
	}
	if err := broker.SetFaults(memory.Faults{LoseAck: s.loseAcks, CrashOnAck: s.crashes}); err != nil {
		return r, err
	}
	r.published = broker.Stats(queue).Published

	handler := func(ctx context.Context, tx Tx, m *core.Message) error {
		var p payment
		if err := json.Unmarshal(m.Body, &p); err != nil || p.Account == "" {
			return core.Permanent(fmt.Errorf("undecodable payment: %v", err))
		}
		if m.Attempt == 1 && failsFirstTime(s.seed, m.ID, s.handlerErrors) {
			return errors.New("injected transient failure (e.g. a lock timeout)")
		}
		return be.handler(ctx, tx, m.ID, p)
	}

	var bar *progressbar.ProgressBar
	if s.progress {
		bar = progressbar.NewOptions(len(payments), progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionSetDescription(fmt.Sprintf("batch %-4d", batch)), progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil)) // the table tells the story
	consumer := "quickstart-" + randomSuffix()               // a fresh dedup key space per run
	start := time.Now()
	res, err := drain.Drain(ctx, broker, queue, func(sub *memory.Subscription) (*core.Consumer[Tx], error) {
		return core.New[Tx](sub, be.store, handler,
			core.WithName(consumer), core.WithBatchSize(batch), core.WithConcurrency(s.concurrency),
			core.WithBackoff(core.ExponentialBackoff{Initial: 5 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2}),
			core.WithHandlerMiddleware(recovery.New(logger)), core.WithLogger(logger),
			core.WithObserver(countProcessed(bar)))
	})
	if err != nil {
		return r, err
	}
	r.received, r.processed, r.duplicates = res.Received, res.Processed, res.Duplicates
	r.retried, r.deadLettered, r.settleErrors, r.crashes = res.Retried, res.DeadLettered, res.SettleErrors, int64(res.Crashes)
	r.wall = time.Since(start)
	if bar != nil {
		_ = bar.Finish()
	}
	return r, verify(ctx, be, payments, broker.Stats(queue), &r)
}

// countProcessed is an observer feeding the progress bar.
func countProcessed(bar *progressbar.ProgressBar) core.Observer {
	return core.DecisionFunc(func(_ context.Context, _ *core.Message, out core.Outcome) {
		if out.Decision == core.Processed && bar != nil {
			_ = bar.Add(1)
		}
	})
}

func verify[Tx any](ctx context.Context, be *backend[Tx], payments []payment, st memory.Stats, r *result) error {
	want := map[string]int64{}
	for _, p := range payments {
		want[p.Account] += p.Amount
	}
	got, err := be.balances(ctx)
	if err != nil {
		return err
	}
	for a, w := range want {
		if got[a] != w {
			r.wrongBalances++
		}
	}
	for a := range got {
		if _, ok := want[a]; !ok {
			r.wrongBalances++
		}
	}
	var distinct int
	if r.ledgerRows, r.doubleApplied, distinct, err = be.ledger(ctx); err != nil {
		return err
	}
	r.lost = len(payments) - distinct + st.Ready + st.Delayed + st.InFlight
	return nil
}

func printTable(out io.Writer, rs []result) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(label string, f func(r result) string) {
		fmt.Fprint(tw, label+"\t")
		for _, r := range rs {
			fmt.Fprint(tw, f(r)+"\t")
		}
		fmt.Fprintln(tw)
	}
	i := func(f func(r result) int64) func(result) string {
		return func(r result) string { return strconv.FormatInt(f(r), 10) }
	}
	row("batch size", i(func(r result) int64 { return int64(r.batch) }))
	if rs[0].producer != nil {
		row("outbox rows written", i(func(r result) int64 { return r.producer.rows }))
		row("relayed (confirmed, marked sent)", i(func(r result) int64 { return r.producer.relayed }))
		row("relay publishes, confirm lost", i(func(r result) int64 { return r.producer.confirmsLost }))
	}
	row("published (with duplicates)", i(func(r result) int64 { return r.published }))
	row("received", i(func(r result) int64 { return r.received }))
	row("processed", i(func(r result) int64 { return r.processed }))
	row("duplicates", i(func(r result) int64 { return r.duplicates }))
	row("retried", i(func(r result) int64 { return r.retried }))
	row("dead-lettered", i(func(r result) int64 { return r.deadLettered }))
	row("consumer crashes", i(func(r result) int64 { return r.crashes }))
	row("wall time", func(r result) string { return r.wall.Round(time.Millisecond).String() })
	row("msgs/s (received)", func(r result) string { return fmt.Sprintf("%.0f", float64(r.received)/r.wall.Seconds()) })
	row("ledger rows", i(func(r result) int64 { return int64(r.ledgerRows) }))
	row("ids applied twice", i(func(r result) int64 { return int64(r.doubleApplied) }))
	row("wrong balances", i(func(r result) int64 { return int64(r.wrongBalances) }))
	row("lost messages", i(func(r result) int64 { return int64(r.lost) }))
	tw.Flush()
}
