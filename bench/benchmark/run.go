package benchmark

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemq/idemq/core"
)

// runEnv is everything one run of one configuration uses.
type runEnv struct {
	cfg    Config
	broker brokerSide
	store  storeSide
	logger *slog.Logger
	w      *workload

	queue, accountsTable, dedupTable, consumer string
	// ledgerTable is the leased scenario's ledger (one row per charge),
	// made by its runs' setup and dropped with the others.
	ledgerTable string
	// The dedup table is made by the run (baselines) or by the idemq
	// store's Migrate; either way it is dropped after the run unless
	// keepDedup is set (the growth scenario's prefilled table).
	keepDedup bool
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// session holds what all runs of a Run share.
type session struct {
	cfg    Config
	broker brokerSide
	store  storeSide
	logger *slog.Logger
	rssHWM bool // VmHWM can be reset through /proc/self/clear_refs
}

// describe is Describe(name), or the broker's or store's own description
// where its consumer differs from the RabbitMQ + Postgres one.
func (s *session) describe(name string) string {
	if d := s.store.describe(name); d != "" {
		return d
	}
	if d := s.broker.describe(name); d != "" {
		return d
	}
	return Describe(name)
}

func (s *session) progress(format string, args ...any) {
	if s.cfg.Progress != nil {
		fmt.Fprintf(s.cfg.Progress, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
}

// Run measures the configurations cfg names and returns their report. A
// configuration whose run fails, or breaks the correctness check, is
// reported as FAILED in the Report; Run itself fails only when cfg is
// invalid, a service cannot be reached, or ctx ends (it then returns the
// report so far as well).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	broker, err := openBroker(ctx, cfg.Broker)
	if err != nil {
		return nil, err
	}
	defer broker.close()
	store, err := openStore(ctx, cfg.Store)
	if err != nil {
		return nil, err
	}
	defer store.close()
	// Fail early and clearly when the broker is unreachable.
	if err := broker.ping(ctx); err != nil {
		return nil, fmt.Errorf("benchmark: connecting to %s: %s", core.Redact(cfg.Broker), core.RedactError(err, cfg.Broker))
	}

	logger := discardLogger
	if cfg.Progress != nil {
		logger = slog.New(slog.NewTextHandler(cfg.Progress, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	s := &session{cfg: cfg, broker: broker, store: store, logger: logger}
	s.rssHWM = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil

	rep := &Report{Started: time.Now()}
	rep.Machine = Machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, GoVersion: runtime.Version(), NumCPU: runtime.NumCPU(), LoadStart: loadAvg()}
	rep.Machine.Database = store.version(ctx)
	rep.Machine.Broker = broker.version(ctx)
	if s.rssHWM {
		rep.Machine.RSSMethod = "VmHWM of the benchmark process (consumer under test, in-process), reset through /proc/self/clear_refs before each run after a GC; publishing happens before the reset"
	} else {
		rep.Machine.RSSMethod = "VmRSS of the benchmark process sampled every 10ms during each run, after a GC before it"
	}
	rep.Params = Params{
		Broker: core.Redact(cfg.Broker), Store: core.Redact(cfg.Store), N: cfg.N, Duplicates: cfg.Duplicates,
		Deliveries: cfg.N + cfg.duplicates(), Accounts: cfg.Accounts, BatchSize: cfg.BatchSize, BatchWorkers: cfg.BatchWorkers,
		Repeat: cfg.Repeat, LatencyRate: cfg.LatencyRate, LatencyMessages: cfg.LatencyMessages, Configs: cfg.Configs,
	}
	if slices.Contains(cfg.Configs, LeasedScenario) {
		rep.Params.LeasedN, rep.Params.LeasedDuplicates = cfg.leasedN, cfg.duplicatesOf(cfg.leasedN)
		rep.Params.ProviderDelay, rep.Params.Pool = cfg.ProviderDelay, cfg.Pool
	}
	defer func() {
		rep.Finished = time.Now()
		rep.Machine.LoadEnd = loadAvg()
	}()

	var plain []string
	for _, name := range cfg.Configs {
		if slices.Contains(DefaultConfigs, name) || slices.Contains(ObservedConfigs, name) || slices.Contains(FrameworkConfigs, name) || slices.Contains(KafkaConfigs, name) {
			plain = append(plain, name)
			rep.Results = append(rep.Results, &Result{Name: name, Description: s.describe(name), Baseline: !strings.HasPrefix(name, "idemq")})
		}
	}
	total := len(plain) * cfg.Repeat
	k := 0
	for rnd := 1; rnd <= cfg.Repeat; rnd++ {
		for _, name := range plain {
			k++
			s.progress("[%d/%d] %s, run %d of %d", k, total, name, rnd, cfg.Repeat)
			res := s.runOne(ctx, name, runSpec{n: cfg.N, dups: cfg.duplicates(), paced: cfg.LatencyMessages})
			if ctx.Err() != nil {
				rep.finishAll()
				return rep, ctx.Err()
			}
			s.progress("    %s", res.line())
			r := rep.result(name)
			r.Runs = append(r.Runs, res)
		}
	}
	for _, name := range cfg.Configs {
		var err error
		switch name {
		case MemoryScenario:
			err = s.memoryScenario(ctx, rep)
		case GrowthScenario:
			err = s.growthScenario(ctx, rep)
		case LeasedScenario:
			err = s.leasedScenario(ctx, rep)
		}
		if err != nil && ctx.Err() != nil {
			rep.finishAll()
			return rep, ctx.Err()
		}
	}
	rep.finishAll()
	return rep, nil
}

func (rep *Report) finishAll() {
	for _, r := range rep.Results {
		r.finish()
	}
	rep.Ratios = nil
	rep.addRatios()
}

func (r RunResult) line() string {
	if r.Error != "" {
		return "FAILED: " + r.Error
	}
	tput := "no backlog"
	if r.Deliveries > 0 {
		tput = fmt.Sprintf("%d deliveries in %.2fs = %.0f msg/s (first decision after %s)", r.Deliveries, r.Seconds, r.MsgsPerSec, fmtLatency(r.FirstDecision))
	}
	st := ""
	if r.Stages != nil {
		st = fmt.Sprintf("; in store stages: begin %.2fs, claim %.2fs, commit %.2fs", r.Stages["begin"].Seconds(), r.Stages["claim"].Seconds(), r.Stages["commit"].Seconds())
		if l, ok := r.Stages["lease"]; ok {
			st += fmt.Sprintf(", lease %.2fs, external %.2fs", l.Seconds(), r.Stages["external"].Seconds())
		}
	}
	if r.UserCPU > 0 {
		tput += fmt.Sprintf(", process CPU per delivery %s user + %s system", fmtCPU(r.UserCPU), fmtCPU(r.SysCPU))
	}
	return fmt.Sprintf("%s; paced p50 %s p99 %s; peak RSS %s; processed %d, duplicates %d, retried %d, dead-lettered %d, transactions %d%s",
		tput, fmtLatency(r.P50), fmtLatency(r.P99), fmtBytes(r.PeakRSS), r.Processed, r.Duplicates, r.Retried, r.DeadLettered, r.Batches, st)
}

// runSpec is the shape of one run.
type runSpec struct {
	n, dups, paced int
	// dedupTable, when set, is an existing dedup table to use and keep.
	dedupTable string
	// whilePaced, when set, runs during the paced phase; the paced phase
	// then lasts until it returns (at most paced messages).
	whilePaced func(ctx context.Context) error
	// setup, when set, runs after the store's setup (the leased
	// scenario's ledger); consume, when set, runs in place of the
	// configuration's consumer until ctx ends; check, when set, is the
	// correctness check in place of the store's.
	setup   func(ctx context.Context, e *runEnv) error
	consume func(ctx context.Context, e *runEnv, t *tracker) (*counts, error)
	check   func(ctx context.Context, e *runEnv, paced int) error
}

// runOne runs one configuration once: fresh queue and tables, backlog
// published, consumer timed over the backlog, paced phase for latency,
// correctness check, clean-up.
func (s *session) runOne(ctx context.Context, name string, spec runSpec) (res RunResult) {
	suffix := randHex(5)
	e := &runEnv{
		cfg: s.cfg, broker: s.broker, store: s.store, logger: s.logger,
		w:             newWorkload(spec.n, spec.dups, s.cfg.Accounts, 1),
		queue:         s.broker.baseQueue() + "-" + suffix,
		accountsTable: "bench_accounts_" + suffix,
		dedupTable:    "bench_processed_" + suffix,
		ledgerTable:   "bench_ledger_" + suffix,
		consumer:      "bench-" + name + "-" + suffix,
	}
	check := s.store.check
	if spec.check != nil {
		check = spec.check
	}
	if spec.dedupTable != "" {
		e.dedupTable, e.keepDedup = spec.dedupTable, true
	}
	fail := func(format string, args ...any) RunResult {
		res.Error = fmt.Sprintf(format, args...)
		return res
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		s.broker.remove(e.queue)
		s.store.drop(cctx, e)
	}()

	if _, ok := s.broker.(watermillBroker); name == Watermill && !ok {
		return fail("%s runs on RabbitMQ only (watermill-amqp), not on %s", Watermill, s.broker.kind())
	}
	if _, ok := s.broker.(franzBroker); slices.Contains(KafkaConfigs, name) && !ok {
		return fail("%s runs on Kafka only (franz-go), not on %s", name, s.broker.kind())
	}
	idemq := strings.HasPrefix(name, "idemq") || strings.Contains(name, "/")
	if err := s.store.setup(ctx, e, !idemq && !e.keepDedup); err != nil {
		return fail("setup: %v", err)
	}
	if spec.setup != nil {
		if err := spec.setup(ctx, e); err != nil {
			return fail("setup: %v", err)
		}
	}
	if err := s.broker.declare(ctx, e.queue); err != nil {
		return fail("declaring the queue: %v", core.RedactError(err, s.cfg.Broker))
	}
	pubStart := time.Now()
	if err := s.broker.publishBacklog(ctx, e.queue, e.w); err != nil {
		return fail("publishing: %v", err)
	}
	if e.w.deliveries > 0 {
		s.progress("    published %d in %.1fs", e.w.deliveries, time.Since(pubStart).Seconds())
	}
	e.w.seq = nil // not to be counted in the consumer's RSS

	t := newTracker(e.w.deliveries)
	rss := s.startRSS()
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	type outcome struct {
		c   *counts
		err error
	}
	done := make(chan outcome, 1)
	failed := make(chan error, 1)
	cpu0 := processCPU()
	start := time.Now()
	go func() {
		var c *counts
		var err error
		switch {
		case spec.consume != nil:
			c, err = spec.consume(cctx, e, t)
		case name == SeedP5:
			c, err = s.broker.seed(cctx, e, t, 5, 1)
		case name == SeedP100W8:
			c, err = s.broker.seed(cctx, e, t, 100, 8)
		case name == HandBatch:
			c, err = s.broker.handBatch(cctx, e, t, s.cfg.BatchSize, s.cfg.BatchWorkers)
		case name == RawAck:
			c, err = s.broker.rawAck(cctx, e, t, s.cfg.BatchSize)
		case name == Watermill:
			c, err = s.broker.(watermillBroker).watermill(cctx, e, t, watermillPrefetch, watermillHandlers)
		case name == SeedFranz:
			c, err = s.broker.(franzBroker).franzSeed(cctx, e, t, 8)
		case name == HandBatchFranz:
			c, err = s.broker.(franzBroker).franzBatch(cctx, e, t, s.cfg.BatchSize, s.cfg.BatchWorkers)
		default:
			c, err = s.store.runIdemq(cctx, e, t, name)
		}
		if cctx.Err() == nil {
			failed <- fmt.Errorf("consumer returned before it was stopped: %v", err)
		}
		done <- outcome{c, err}
	}()
	stopConsumer := func() outcome {
		stop()
		select {
		case o := <-done:
			return o
		case <-time.After(60 * time.Second):
			return outcome{nil, errors.New("consumer did not stop within 60s")}
		}
	}

	report := func(c int64) { s.progress("    … %d of %d", c, e.w.deliveries) }
	if err := t.waitProgress(ctx, t.backlogDone, failed, 60*time.Second, report); err != nil {
		o := stopConsumer()
		return fail("backlog: %v (consumer: %v)", err, o.err)
	}
	res.Deliveries = e.w.deliveries
	if cpu1 := processCPU(); res.Deliveries > 0 {
		res.UserCPU = (cpu1[0] - cpu0[0]) / time.Duration(res.Deliveries)
		res.SysCPU = (cpu1[1] - cpu0[1]) / time.Duration(res.Deliveries)
	}
	res.Seconds = time.Duration(t.backlogAt.Load() - start.UnixNano()).Seconds()
	if f := t.firstAt.Load(); f > 0 && res.Deliveries > 0 {
		res.FirstDecision = time.Duration(f - start.UnixNano())
	}
	if res.Deliveries > 0 && res.Seconds > 0 {
		res.MsgsPerSec = float64(res.Deliveries) / res.Seconds
	}
	res.Batches = t.batches.Load()

	// The paced phase: open-loop publishing, latency from publish time.
	sent := 0
	if spec.paced > 0 {
		var side chan error
		var stopPaced chan struct{}
		if spec.whilePaced != nil {
			side, stopPaced = make(chan error, 1), make(chan struct{})
			go func() { side <- spec.whilePaced(cctx); close(stopPaced) }()
		}
		var err error
		sent, err = s.broker.publishPaced(ctx, e.queue, e.w, s.cfg.LatencyRate, spec.paced, min(spec.paced, s.cfg.LatencyMessages), stopPaced)
		if err != nil {
			stopConsumer()
			return fail("paced publishing: %v", err)
		}
		t.setTotal(e.w.deliveries + sent)
		if side != nil {
			if err := <-side; err != nil && cctx.Err() == nil {
				stopConsumer()
				return fail("while paced: %v", err)
			}
		}
	} else {
		t.setTotal(e.w.deliveries)
	}
	if err := t.waitProgress(ctx, t.allDone, failed, 60*time.Second, nil); err != nil {
		o := stopConsumer()
		return fail("paced phase: %v (consumer: %v)", err, o.err)
	}
	if name != RawAck {
		// The tracker counts deliveries decided. A broker may deliver a
		// message again (Kafka after a rebalance moved a partition whose
		// offset commit had not landed): the duplicate is decided, the
		// count reaches the total while another message is still in
		// flight. Let the consumer finish it before stopping it; the check
		// after the stop is the one that counts.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if check(ctx, e, sent) == nil {
				break
			}
		}
	}
	o := stopConsumer()
	res.PeakRSS = rss()
	if o.err != nil {
		return fail("consumer: %v", o.err)
	}
	if o.c != nil {
		res.Processed, res.Duplicates = o.c.processed.Load(), o.c.duplicates.Load()
		res.Retried, res.DeadLettered = o.c.retried.Load(), o.c.deadLettered.Load()
		res.Stages = o.c.stages
	}
	t.mu.Lock()
	res.P50, res.P99 = percentile(t.pacedLat, 0.50), percentile(t.pacedLat, 0.99)
	res.BacklogP99 = t.backlogLat.percentile(0.99)
	t.mu.Unlock()

	if name != RawAck {
		if err := check(ctx, e, sent); err != nil {
			return fail("correctness: %v", err)
		}
	}
	return res
}

// startRSS prepares to measure the peak RSS of the coming run and returns
// the function that reads it at the end.
func (s *session) startRSS() func() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	if s.rssHWM && os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil {
		return func() int64 { return procStatus("VmHWM:") }
	}
	stop := make(chan struct{})
	peak := make(chan int64, 1)
	go func() {
		var p int64
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			p = max(p, procStatus("VmRSS:"))
			select {
			case <-tick.C:
			case <-stop:
				peak <- p
				return
			}
		}
	}()
	return func() int64 { close(stop); return <-peak }
}

// procStatus reads a kB field of /proc/self/status, in bytes (0 where
// there is no /proc).
func procStatus(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func loadAvg() [3]float64 {
	var l [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
}

// processCPU returns the process's user and system CPU time so far (zero
// where getrusage is not available).
func processCPU() [2]time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return [2]time.Duration{}
	}
	return [2]time.Duration{time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())}
}
