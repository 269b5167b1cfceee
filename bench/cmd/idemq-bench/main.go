// Command idemq-bench measures a broker and store pair: it publishes the
// same payment workload to the broker and consumes it into the store with
// hand-written baseline consumers and with idemq, in turn, and prints
// msgs/s and decision latency side by side (package benchmark does the
// work):
//
//	idemq-bench --broker URL --store URL -n 100000 --duplicates 0.2
//
// It belongs to the bench module, beside the library's: from a checkout,
// `cd bench && go run ./cmd/idemq-bench --help`. Credentials in URLs never
// appear in the output.
//
// Exit codes, for scripts: 0 success, 1 failure (a configuration failed
// or broke the correctness check, the broker or store failed, or the run
// was interrupted), 2 usage error (bad or missing flag).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/internal/cli"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/idemq/idemq/bench/benchmark"
	"github.com/idemq/idemq/core"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var err error
	if len(args) > 0 && args[0] == "summary" {
		err = runSummary(args[1:], stdout)
	} else {
		err = runBench(ctx, args, stdout, stderr)
	}
	switch {
	case err == nil, errors.Is(err, cli.ErrHelp):
		return exitOK
	case errors.As(err, new(cli.UsageError)):
		fmt.Fprintf(stderr, "idemq-bench: %v\nRun 'idemq-bench --help' for usage.\n", err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "idemq-bench: %v\n", err)
		return exitFailure
	}
}

const benchUsage = `Usage: idemq-bench --broker URL --store URL [-n 100000] [--duplicates 0.2] [--batch 200]

Publishes N payment messages (plus the duplicates) to the broker and
consumes them into the store with each configuration in turn: seed-style
consumers written on the raw drivers (one transaction per message, no
framework), a hand-tuned batch consumer, and idemq at batch size 1 and at
--batch. It prints msgs/s (median of --repeat runs) and p50/p99 decision
latency per configuration, the ratios of idemq to the baselines, and the
machine it ran on. Every run is checked: each unique message applied once.

Each run uses its own queue (topic, stream) and tables and removes them afterwards.

Brokers (--broker):
  amqp://, amqps://  RabbitMQ   amqp://guest:guest@127.0.0.1:5672/?queue=idemq-bench
  kafka://           Kafka      kafka://127.0.0.1:9092/idemq-bench?partitions=8
                                (a local cluster: go run ./cmd/kfake -addr 127.0.0.1:9092)
  sqs://             SQS        sqs://KEY:SECRET@idemq-bench?endpoint=http://127.0.0.1:9324&region=us-east-1
                                (batches of at most 10: --batch defaults to 10)
  nats://            NATS       nats://127.0.0.1:4222/idemq-bench  (JetStream; the path is the stream)
  redis://           Redis      redis://127.0.0.1:6379/idemq-bench  (Streams; the path is the stream)
                                (rediss:// with TLS)
Stores (--store):
  postgres://, postgresql://    postgres://postgres@127.0.0.1:5432/test
  mysql://  (MariaDB, MySQL)    mysql://root@127.0.0.1:3306/test

Exit code 1 if a configuration failed or broke the correctness check.

idemq-bench summary [--png FILE] REPORT.json... prints the targets' tables
(Markdown) over the JSON reports of several pairs.
`

const summaryUsage = `Usage: idemq-bench summary [--png FILE] REPORT.json...

Reads the JSON reports (--json) of runs of several broker and store pairs and
prints, as Markdown tables: idemq-batch against hand-batch per pair (medians
with min–max, the lowest and highest interleaved pair of runs, user CPU per
delivery), idemq at batch size 1 against the seed pattern, and the observed,
raw-broker and Watermill ratios where a report ran them.
`

func runSummary(args []string, stdout io.Writer) error {
	f := cli.NewFlags("idemq-bench summary", summaryUsage, stdout)
	pngOut := f.String("png", "", "also draw idemq-batch / hand-batch per pair to this PNG file")
	// The flag set's own Parse takes no file names: parse the flags and
	// keep the rest.
	if err := f.FlagSet.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, summaryUsage+"\nFlags:\n")
		f.SetOutput(stdout)
		f.PrintDefaults()
		return cli.ErrHelp
	} else if err != nil {
		return cli.Usagef("summary: %v", err)
	}
	if f.NArg() == 0 {
		return cli.Usagef("summary: no report given")
	}
	var reps []*benchmark.Report
	for _, name := range f.Args() {
		file, err := os.Open(name)
		if err != nil {
			return err
		}
		rep, err := benchmark.ReadReport(file)
		file.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		reps = append(reps, rep)
	}
	if err := benchmark.WriteSummary(stdout, reps); err != nil {
		return err
	}
	if *pngOut != "" {
		return benchmark.WriteSummaryPNG(*pngOut, reps)
	}
	return nil
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags("idemq-bench", benchUsage, stdout)
	broker := f.String("broker", "", "broker URL: "+benchmark.BrokerSchemes+" (e.g. amqp://guest:guest@127.0.0.1:5672/?queue=idemq-bench, kafka://127.0.0.1:9092/idemq-bench, sqs://KEY:SECRET@idemq-bench?endpoint=…, nats://127.0.0.1:4222/idemq-bench, redis://127.0.0.1:6379/idemq-bench) (required)")
	storeURL := f.StoreFlag()
	n := f.Int("n", 0, "unique messages per run (default 50000; 3000 for the leased scenario)")
	dups := f.Float64("duplicates", 0.2, "fraction of N published a second time")
	accounts := f.Int("accounts", 1000, "accounts the payments spread over")
	batch := f.Int("batch", 0, "batch size of the batch-mode configurations (idemq and hand-tuned) (default 200; 10, the most, for sqs://)")
	workers := f.Int("workers", 1, "batches processed at once by the batch-mode configurations")
	repeat := f.Int("repeat", 3, "runs per configuration (interleaved); the table shows the median")
	configs := f.String("configs", "", "comma-separated configurations to run (default all of: "+strings.Join(benchmark.DefaultConfigs, ", ")+"; on demand: the observed variants "+strings.Join(benchmark.ObservedConfigs, ", ")+", the seed pattern on other frameworks "+strings.Join(benchmark.FrameworkConfigs, ", ")+" (RabbitMQ only), the franz-go baselines "+strings.Join(benchmark.KafkaConfigs, ", ")+" (Kafka only) and the slow scenarios "+strings.Join(benchmark.Scenarios, ", ")+")")
	rate := f.Int("latency-rate", 200, "msg/s of the paced phase that measures p50/p99")
	latencyN := f.Int("latency-messages", 1000, "messages in the paced phase")
	pruneBatch := f.Int("prune-batch", 1000, "rows per DELETE while the growth scenario prunes")
	pruneDuty := f.Float64("prune-duty", admin.DefaultPruneDuty, "fraction of the growth scenario's prune time spent deleting (resting the rest)")
	providerDelay := f.Duration("provider-delay", 300*time.Millisecond, "how long the leased scenario's fake payment provider takes to answer each charge")
	pool := f.Int("pool", 10, "the leased scenario's Postgres pool size (pool_max_conns), unless --store sets one")
	jsonOut := f.String("json", "", "also write the full report as JSON to this file")
	pngOut := f.String("png", "", "also write a chart of the results to this PNG file")
	cpuProfile := f.String("cpuprofile", "", "write a CPU profile of the whole run (baselines included: narrow it with --configs) to this file, for go tool pprof")
	memProfile := f.String("memprofile", "", "write an allocation profile of the whole run (publishing and baselines included) to this file, for go tool pprof -sample_index=alloc_objects")
	progress := f.Bool("progress", term.IsTerminal(int(os.Stderr.Fd())), "show a progress bar on stderr (default: when stderr is a terminal; otherwise progress lines)")
	if err := f.Parse(args); err != nil {
		return err
	}
	raw, err := storeURL()
	if err != nil {
		return err
	}
	switch {
	case *broker == "":
		return cli.Usagef("--broker is required")
	case *n < 0 || isFlagSet(f, "n") && *n < 1:
		return cli.Usagef("-n %d: must be at least 1", *n)
	case !(*dups >= 0 && *dups <= 10):
		return cli.Usagef("--duplicates %v: must be from 0 to 10", *dups)
	case *batch < 0 || isFlagSet(f, "batch") && *batch < 1:
		return cli.Usagef("--batch %d: must be at least 1", *batch)
	case *workers < 1:
		return cli.Usagef("--workers %d: must be at least 1", *workers)
	case *repeat < 1:
		return cli.Usagef("--repeat %d: must be at least 1", *repeat)
	case *pruneBatch < 1:
		return cli.Usagef("--prune-batch %d: must be at least 1", *pruneBatch)
	case !(*pruneDuty > 0 && *pruneDuty <= 1):
		return cli.Usagef("--prune-duty %v: must be above 0 and at most 1", *pruneDuty)
	case *providerDelay <= 0:
		return cli.Usagef("--provider-delay %v: must be above 0", *providerDelay)
	case *pool < 1:
		return cli.Usagef("--pool %d: must be at least 1", *pool)
	}
	cfg := benchmark.Config{
		Broker: *broker, Store: raw, N: *n, Duplicates: *dups, Accounts: *accounts,
		BatchSize: *batch, BatchWorkers: *workers, Repeat: *repeat,
		LatencyRate: *rate, LatencyMessages: *latencyN, PruneBatch: *pruneBatch, PruneDuty: *pruneDuty,
		ProviderDelay: *providerDelay, Pool: *pool,
	}
	if *dups == 0 {
		cfg.Duplicates = -1 // the benchmark's "none" (its zero value means the default)
	}
	if *configs != "" {
		for _, c := range strings.Split(*configs, ",") {
			cfg.Configs = append(cfg.Configs, strings.TrimSpace(c))
		}
	}
	secrets := func(s string) string {
		return core.RedactError(errors.New(core.RedactError(errors.New(s), *broker)), raw)
	}
	pw := &progressWriter{out: stderr, redact: secrets}
	if *progress {
		pw.bar = progressbar.NewOptions(-1, progressbar.OptionSetWriter(stderr), progressbar.OptionSetDescription("starting"),
			progressbar.OptionShowCount(), progressbar.OptionSetWidth(30), progressbar.OptionClearOnFinish())
	}
	cfg.Progress = pw
	if *cpuProfile != "" {
		pf, perr := os.Create(*cpuProfile)
		if perr != nil {
			return fmt.Errorf("--cpuprofile: %w", perr)
		}
		defer pf.Close()
		if perr := pprof.StartCPUProfile(pf); perr != nil {
			return fmt.Errorf("--cpuprofile: %w", perr)
		}
	}
	rep, err := benchmark.Run(ctx, cfg)
	if *cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		if perr := writeHeapProfile(*memProfile); perr != nil {
			return fmt.Errorf("--memprofile: %w", perr)
		}
	}
	pw.finish()
	if err != nil && rep == nil {
		msg := secrets(err.Error())
		if strings.Contains(msg, "benchmark: Config.") {
			return cli.Usagef("%s", msg)
		}
		return errors.New(msg)
	}
	var table bytes.Buffer
	rep.WriteTable(&table)
	io.WriteString(stdout, secrets(table.String()))
	if *jsonOut != "" {
		var js bytes.Buffer
		rep.WriteJSON(&js)
		if werr := os.WriteFile(*jsonOut, []byte(secrets(js.String())), 0o644); werr != nil {
			return fmt.Errorf("--json: %w", werr)
		}
	}
	if *pngOut != "" {
		if werr := rep.WritePNG(*pngOut); werr != nil {
			return fmt.Errorf("--png: %w", werr)
		}
	}
	if err != nil {
		return errors.New(secrets(err.Error()))
	}
	var failed []string
	for _, r := range rep.Results {
		if r.Failed != "" {
			failed = append(failed, r.Name)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("configurations failed: %s", strings.Join(failed, ", "))
	}
	return nil
}

// isFlagSet reports whether the command line gave the flag name.
func isFlagSet(f *cli.Flags, name string) bool {
	set := false
	f.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	return set
}

// progressLine is how benchmark.Run announces each run: "[k/total] name, run r of R".
var progressLine = regexp.MustCompile(`^\[(\d+)/(\d+)\] (.*)$`)

// progressWriter turns the benchmark's progress lines into a progress bar
// (k of total runs) when bar is set, or passes them through; either way
// with credentials redacted.
type progressWriter struct {
	mu     sync.Mutex
	out    io.Writer
	bar    *progressbar.ProgressBar
	redact func(string) string
	buf    []byte
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		line := p.redact(string(p.buf[:i]))
		p.buf = p.buf[i+1:]
		if p.bar == nil {
			fmt.Fprintln(p.out, line)
			continue
		}
		if m := progressLine.FindStringSubmatch(line); m != nil {
			k, _ := strconv.Atoi(m[1])
			total, _ := strconv.Atoi(m[2])
			p.bar.ChangeMax(total)
			p.bar.Set(k - 1)
			p.bar.Describe(m[3])
			continue
		}
		if strings.HasPrefix(line, "    ") {
			continue // a finished run's figures: the table shows them
		}
		p.bar.Clear()
		fmt.Fprintln(p.out, line)
	}
}

func (p *progressWriter) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		p.bar.Finish()
	}
}

// writeHeapProfile writes the allocations since the start (the heap
// profile's alloc_objects and alloc_space) to path.
func writeHeapProfile(path string) error {
	pf, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(pprof.Lookup("allocs").WriteTo(pf, 0), pf.Close())
}
