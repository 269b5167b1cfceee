package benchmark

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the outcome of one Run: one Result per configuration, the
// ratios the performance targets are stated in, and the machine they were
// measured on.
type Report struct {
	// Started and Finished bound the whole Run.
	Started, Finished time.Time
	// Machine describes where the numbers were measured.
	Machine Machine
	// Params are the effective parameters (defaults filled in).
	Params Params
	// Results has one entry per configuration (and per scenario step), in
	// the order run.
	Results []*Result
	// Ratios compare configurations as idemq's performance targets state them;
	// only ratios whose both sides ran are present.
	Ratios []Ratio
}

// Machine describes the machine and services of a Run, so that numbers are
// never quoted without their context.
type Machine struct {
	GOOS, GOARCH, GoVersion string
	NumCPU                  int
	// LoadStart and LoadEnd are /proc/loadavg (1, 5, 15 minutes) at the
	// start and end of the Run: the machine may be shared.
	LoadStart, LoadEnd [3]float64
	// Database and Broker are the servers' version strings.
	Database, Broker string
	// RSSMethod says how PeakRSS was measured.
	RSSMethod string
}

// Params are the effective Config values of a Run.
type Params struct {
	Broker, Store   string // credentials redacted
	N               int
	Duplicates      float64
	Deliveries      int // N plus the duplicate publishes, per run
	Accounts        int
	BatchSize       int
	BatchWorkers    int
	Repeat          int
	LatencyRate     int
	LatencyMessages int
	Configs         []string
	// LeasedN and LeasedDuplicates are the unique messages and extra
	// deliveries of each leased scenario run, ProviderDelay the fake
	// provider's answer time and Pool the consumers' pool size there.
	LeasedN          int           `json:",omitempty"`
	LeasedDuplicates int           `json:",omitempty"`
	ProviderDelay    time.Duration `json:",omitempty"`
	Pool             int           `json:",omitempty"`
}

// Result is one configuration's measurements over its runs.
type Result struct {
	// Name is the configuration's name (see DefaultConfigs, Scenarios);
	// scenario steps are named "<scenario>/<step>".
	Name string
	// Description says what the configuration is.
	Description string
	// Baseline is true for the hand-written consumers (no idemq).
	Baseline bool
	// Runs are the individual runs, in order.
	Runs []RunResult
	// Failed is set when any run failed (an error or a broken
	// correctness check); the figures below then cover only the runs that
	// passed, and the table shows FAILED.
	Failed string
	// MsgsPerSec summarises the passing runs' throughput.
	MsgsPerSec Summary
	// P50 and P99 are the medians over passing runs of the paced phase's
	// publish-to-decision latency percentiles.
	P50, P99 time.Duration
	// PeakRSS is the largest peak resident set size of any passing run,
	// in bytes.
	PeakRSS int64
	// UserCPU is the median over passing runs of the benchmark process's
	// user CPU time per delivery in the backlog phase.
	UserCPU time.Duration
	// PeakOpenTx and PeakPoolConns are the largest of the passing runs'
	// (the leased scenario's); MeanOpenTx and TxTimePerMsg are the medians
	// of theirs.
	PeakOpenTx    int           `json:",omitempty"`
	MeanOpenTx    float64       `json:",omitempty"`
	TxTimePerMsg  time.Duration `json:",omitempty"`
	PeakPoolConns int           `json:",omitempty"`
}

// RunResult is one run of a configuration.
type RunResult struct {
	// Deliveries is the number of deliveries decided in the timed backlog
	// phase, Seconds how long that took: MsgsPerSec = Deliveries/Seconds.
	Deliveries int
	Seconds    float64
	MsgsPerSec float64
	// FirstDecision is the time from the consumer's start to its first
	// decision, included in Seconds: connecting, joining a consumer group
	// (Kafka), opening idemq's store and source. On a short run it weighs
	// in the throughput; compare it between configurations.
	FirstDecision time.Duration `json:",omitempty"`
	// P50 and P99 are the publish-to-decision latencies of the paced
	// phase (LatencyMessages at LatencyRate); BacklogP99 is the same for
	// the backlog, where it mostly measures time spent queued.
	P50, P99, BacklogP99 time.Duration
	// PeakRSS is the process's peak resident set size during the run, in
	// bytes (see Machine.RSSMethod).
	PeakRSS int64
	// UserCPU and SysCPU are the benchmark process's CPU time per delivery
	// in the backlog phase (getrusage), consumer and its client libraries
	// together; the broker and the database run in processes of their
	// own. Publishing is over before the phase begins.
	UserCPU, SysCPU time.Duration
	// Processed and Duplicates count decisions (idemq: from the
	// Consumer's Stats; baselines: claims won and lost). Retried and
	// DeadLettered are idemq's; non-zero values are not failures (a
	// deadlock retried is legitimate) but are worth reading.
	Processed, Duplicates, Retried, DeadLettered int64
	// Batches is the number of transactions (or multiple acks, for
	// raw-ack) in the backlog phase, where known.
	Batches int64
	// Stages is, for idemq configurations, the total time spent in each
	// store stage (begin, claim, commit) over the run, summed over
	// concurrent transactions: set beside Seconds, it shows where time
	// goes.
	Stages map[string]time.Duration `json:",omitempty"`
	// PeakOpenTx is, for the leased scenario, the most database
	// transactions the consumer's sessions held open at once, MeanOpenTx
	// their mean, over Samples samples taken every 5ms from
	// pg_stat_activity while the consumer ran (start-up and the idle tail
	// included); TxTimePerMsg is their time integral per delivery, the
	// transaction time each message cost. PeakPoolConns is the most
	// connections the consumer's pool had acquired at once.
	PeakOpenTx    int           `json:",omitempty"`
	MeanOpenTx    float64       `json:",omitempty"`
	TxTimePerMsg  time.Duration `json:",omitempty"`
	Samples       int64         `json:",omitempty"`
	PeakPoolConns int           `json:",omitempty"`
	// PoolAcquires is how many connections the consumer's pool handed out
	// in the run, PoolWaited how many of those waited for one to be free,
	// and PoolAcquireTime the time spent acquiring them all, waits
	// included (pgxpool's Stat): where the pool bounds a run.
	PoolAcquires    int64         `json:",omitempty"`
	PoolWaited      int64         `json:",omitempty"`
	PoolAcquireTime time.Duration `json:",omitempty"`
	// Error is set when the run failed or its correctness check did not
	// hold; its numbers are then not used.
	Error string
}

// Summary is the median and range of a set of measurements.
type Summary struct {
	Median, Min, Max float64
}

// Ratio compares two configurations' throughput (or, for the scenarios,
// latency or memory) as one of idemq's performance targets states it.
type Ratio struct {
	// Name says what is compared, e.g. "idemq-batch / hand-batch".
	Name string
	// Metric is "msgs/s", "p99", "peak RSS" or "user CPU/msg".
	Metric string
	// Value is numerator / denominator, from the medians.
	Value float64
	// Target is the target as text (e.g. "≥ 0.90"); Met says
	// whether Value meets it.
	Target string
	Met    bool
}

func summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Summary{Median: med, Min: s[0], Max: s[len(s)-1]}
}

func medianDuration(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// finish computes the summary fields from the runs.
func (r *Result) finish() {
	var tput, meanTx []float64
	var p50, p99, cpu, txTime []time.Duration
	r.PeakRSS, r.PeakOpenTx, r.PeakPoolConns = 0, 0, 0
	for _, run := range r.Runs {
		if run.Error != "" {
			if r.Failed == "" {
				r.Failed = run.Error
			}
			continue
		}
		if run.MsgsPerSec > 0 {
			tput = append(tput, run.MsgsPerSec)
		}
		if run.P99 > 0 {
			p50 = append(p50, run.P50)
			p99 = append(p99, run.P99)
		}
		r.PeakRSS = max(r.PeakRSS, run.PeakRSS)
		if run.UserCPU > 0 {
			cpu = append(cpu, run.UserCPU)
		}
		if run.Samples > 0 {
			r.PeakOpenTx = max(r.PeakOpenTx, run.PeakOpenTx)
			r.PeakPoolConns = max(r.PeakPoolConns, run.PeakPoolConns)
			meanTx = append(meanTx, run.MeanOpenTx)
			txTime = append(txTime, run.TxTimePerMsg)
		}
	}
	r.MeanOpenTx = summarize(meanTx).Median
	r.TxTimePerMsg = medianDuration(txTime)
	r.UserCPU = medianDuration(cpu)
	r.MsgsPerSec = summarize(tput)
	r.P50 = medianDuration(p50)
	r.P99 = medianDuration(p99)
}

func (rep *Report) result(name string) *Result {
	for _, r := range rep.Results {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// addRatios appends the ratios of the performance targets whose both sides ran
// and passed.
func (rep *Report) addRatios() {
	tput := func(num, den, target string, min float64) {
		a, b := rep.result(num), rep.result(den)
		if a == nil || b == nil || a.Failed != "" || b.Failed != "" || b.MsgsPerSec.Median == 0 {
			return
		}
		v := a.MsgsPerSec.Median / b.MsgsPerSec.Median
		rep.Ratios = append(rep.Ratios, Ratio{Name: num + " / " + den, Metric: "msgs/s", Value: v, Target: target, Met: v >= min})
	}
	for _, batch := range []string{IdemqBatch, IdemqQueue} {
		tput(batch, HandBatch, "≥ 1.00", 1)
		tput(batch, SeedP100W8, "≥ 7", 7)
		tput(batch, SeedP5, "≥ 15", 15)
	}
	tput(IdemqB1W5, SeedP5, "≥ 1.00", 1)
	tput(IdemqB1W100C8, SeedP100W8, "≥ 1.00", 1)
	tput(IdemqBatch, RawAck, "≥ 0.90", 0.90)
	tput(IdemqBatch, Watermill, "≥ 8", 8)
	tput(Watermill, SeedP100W8, "(peer)", 0)
	tput(HandBatch, RawAck, "(ceiling)", 0)
	tput(IdemqBatch, HandBatchFranz, "≥ 1.00", 1)
	tput(IdemqB1W100C8, SeedFranz, "≥ 1.00", 1)
	tput(HandBatchFranz, HandBatch, "(franz-go / kafka-go)", 0)
	for _, hand := range []string{HandBatch, HandBatchFranz} {
		if a, b := rep.result(IdemqBatch), rep.result(hand); a != nil && b != nil && a.Failed == "" && b.Failed == "" && a.UserCPU > 0 && b.UserCPU > 0 {
			v := float64(a.UserCPU) / float64(b.UserCPU)
			rep.Ratios = append(rep.Ratios, Ratio{Name: a.Name + " / " + b.Name, Metric: "user CPU/msg", Value: v, Target: "≤ 1.10", Met: v <= 1.1})
		}
	}
	if lo, _, ok := rep.Paired(IdemqBatch, HandBatch); ok {
		rep.Ratios = append(rep.Ratios, Ratio{Name: IdemqBatch + " / " + HandBatch, Metric: "lowest paired run", Value: lo, Target: "≥ 0.95", Met: lo >= 0.95})
	}
	for _, observed := range ObservedConfigs {
		tput(observed, IdemqBatch, "≥ 0.90", 0.90)
		tput(observed, HandBatch, "≥ 0.90", 0.90)
		if a, b := rep.result(observed), rep.result(IdemqBatch); a != nil && b != nil && a.Failed == "" && b.Failed == "" && a.UserCPU > 0 && b.UserCPU > 0 {
			v := float64(a.UserCPU) / float64(b.UserCPU)
			rep.Ratios = append(rep.Ratios, Ratio{Name: a.Name + " / " + b.Name, Metric: "user CPU/msg", Value: v, Target: "≤ 1.30", Met: v <= 1.3})
		}
	}

	if a, b := rep.result(MemoryScenario+"/1m"), rep.result(MemoryScenario+"/10k"); a != nil && b != nil && a.Failed == "" && b.Failed == "" && b.PeakRSS > 0 {
		v := float64(a.PeakRSS) / float64(b.PeakRSS)
		rep.Ratios = append(rep.Ratios, Ratio{Name: a.Name + " / " + b.Name, Metric: "peak RSS", Value: v, Target: "≤ 1.25 (flat)", Met: v <= 1.25})
	}
	tput(GrowthScenario+"/full", GrowthScenario+"/empty", "≥ 0.80", 0.80)
	// The expectation at window 500: the calls overlap 500 at a
	// time instead of one per pooled connection.
	tput(leasedLeased, leasedInTx, "≥ 10", 10)
	if a, b := rep.result(GrowthScenario+"/prune"), rep.result(GrowthScenario+"/quiet"); a != nil && b != nil && a.Failed == "" && b.Failed == "" && b.P99 > 0 {
		v := float64(a.P99) / float64(b.P99)
		rep.Ratios = append(rep.Ratios, Ratio{Name: a.Name + " / " + b.Name, Metric: "p99", Value: v, Target: "≤ 2", Met: v <= 2})
	}
}

// WriteTable writes the report as an aligned text table: one row per
// configuration with msgs/s (median, min–max), p50/p99 decision latency
// and peak RSS, then the ratios and the machine.
func (rep *Report) WriteTable(w io.Writer) error {
	// The open transactions' columns only where some configuration
	// sampled them (the leased scenario).
	sampled := slices.ContainsFunc(rep.Results, func(r *Result) bool { return r.PeakPoolConns > 0 || r.PeakOpenTx > 0 })
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "configuration\tmsgs/s (median)\tmin–max\tp50\tp99\tpeak RSS\tuser CPU/msg\t")
	if sampled {
		fmt.Fprintf(tw, "open tx peak\ttx time/msg\tpool conns peak\t")
	}
	fmt.Fprintf(tw, "\n")
	for _, r := range rep.Results {
		if r.Failed != "" {
			fmt.Fprintf(tw, "%s\tFAILED\t\t\t\t\t\t\n", r.Name)
			continue
		}
		tp, rng := "–", ""
		if r.MsgsPerSec.Median > 0 {
			tp = fmt.Sprintf("%.0f", r.MsgsPerSec.Median)
			rng = fmt.Sprintf("%.0f–%.0f", r.MsgsPerSec.Min, r.MsgsPerSec.Max)
		}
		cpu := "–"
		if r.UserCPU > 0 {
			cpu = fmtCPU(r.UserCPU)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t", r.Name, tp, rng, fmtLatency(r.P50), fmtLatency(r.P99), fmtBytes(r.PeakRSS), cpu)
		if sampled && (r.PeakOpenTx > 0 || r.PeakPoolConns > 0) {
			fmt.Fprintf(tw, "%d\t%s\t%d\t", r.PeakOpenTx, fmtLatency(r.TxTimePerMsg), r.PeakPoolConns)
		} else if sampled {
			fmt.Fprintf(tw, "–\t–\t–\t")
		}
		fmt.Fprintf(tw, "\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	for _, r := range rep.Results {
		if r.Failed != "" {
			fmt.Fprintf(&b, "FAILED %s: %s\n", r.Name, r.Failed)
		}
	}
	if len(rep.Ratios) > 0 {
		b.WriteString("\nratios (medians)\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		for _, x := range rep.Ratios {
			verdict := "met"
			if !x.Met {
				verdict = "MISSED"
			}
			if x.Target == "(ceiling)" || x.Target == "(peer)" {
				verdict = ""
			}
			fmt.Fprintf(tw, "  %s\t%s\t%.2f\ttarget %s\t%s\n", x.Name, x.Metric, x.Value, x.Target, verdict)
		}
		tw.Flush()
	}
	m, p := rep.Machine, rep.Params
	b.WriteString("\n")
	// The shared workload's line, unless the leased scenario, which has a
	// workload of its own, ran alone.
	if len(p.Configs) != 1 || p.Configs[0] != LeasedScenario {
		fmt.Fprintf(&b, "%d deliveries per run (%d unique, %.0f%% duplicates), %d accounts, batch %d × %d worker(s), %d run(s) each, latency paced at %d msg/s × %d\n",
			p.Deliveries, p.N, p.Duplicates*100, p.Accounts, p.BatchSize, p.BatchWorkers, p.Repeat, p.LatencyRate, p.LatencyMessages)
	}
	if rep.result(leasedInTx) != nil {
		fmt.Fprintf(&b, "%s: %d unique + %d duplicates a run, %d accounts, %d run(s) each; provider answering each charge in %s, Postgres pool %d, window %d, completion batch %d × %d; open transactions sampled every %s from pg_stat_activity (the consumer's sessions only; tx time/msg is their time integral per delivery)\n",
			LeasedScenario, p.LeasedN, p.LeasedDuplicates, p.Accounts, p.Repeat, p.ProviderDelay, p.Pool, leasedWindow, leasedBatch, leasedWorkers, sampleEvery)
	}
	fmt.Fprintf(&b, "%s/%s, %d CPUs, %s; %s; %s\n", m.GOOS, m.GOARCH, m.NumCPU, m.GoVersion, m.Database, m.Broker)
	fmt.Fprintf(&b, "load average %.2f %.2f %.2f at start, %.2f %.2f %.2f at end; %s in %s\n",
		m.LoadStart[0], m.LoadStart[1], m.LoadStart[2], m.LoadEnd[0], m.LoadEnd[1], m.LoadEnd[2],
		rep.Started.UTC().Format(time.RFC3339), rep.Finished.Sub(rep.Started).Round(time.Second))
	fmt.Fprintf(&b, "peak RSS: %s\n", m.RSSMethod)
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the whole report, every run included, as indented JSON
// (durations in nanoseconds).
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

func fmtLatency(d time.Duration) string {
	switch {
	case d <= 0:
		return "–"
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return d.Round(time.Second).String()
}

// fmtCPU formats a CPU time per delivery in microseconds.
func fmtCPU(d time.Duration) string {
	return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
}

func fmtBytes(n int64) string {
	if n <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
}
