package benchmark

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
)

// The Kafka share-group (KIP-932) comparison: a hand-written franz-go
// share-group consumer against idemq's Consumer over kafka+share://,
// on the same workload in the same run, alternated as Run alternates its
// configurations. Both read the same kind of topic (8 partitions,
// published by kafka-go as the Kafka runs are), both are one share-group
// member taking at most `window` records a poll, and both apply a poll's
// records in one Postgres transaction: the hand-tuned batch transaction
// (batchTx) for the hand side, a BatchHandler with its set-based UPDATE
// queued with the COMMIT for idemq.

// shareBroker is the Kafka side of a run whose consumers read through a
// share group: topics, publishing and clean-up as kafkaBroker's, idemq's
// source at kafka+share://.
type shareBroker struct {
	*kafkaBroker
}

func (k shareBroker) kind() string { return "Kafka share groups" }

func (k shareBroker) version(ctx context.Context) string {
	return strings.Replace(k.kafkaBroker.version(ctx), "(kafka-go client)", "(published with kafka-go, read through share groups with franz-go)", 1)
}

func (k shareBroker) sourceURL(queue, group string) string {
	u := url.URL{Scheme: "kafka+share", Host: strings.Join(k.brokers, ","), Path: "/" + queue}
	u.RawQuery = url.Values{"group": {group}}.Encode()
	return u.String()
}

// shareStartEarliest sets the share group's share.auto.offset.reset to
// earliest, so that it reads the backlog published before it joins (what
// kafka.OpenShare does with WithStart(StartFirst), its default).
func shareStartEarliest(ctx context.Context, cl *kgo.Client, group string) error {
	value := "earliest"
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	rr := kmsg.NewIncrementalAlterConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Op, c.Value = "share.auto.offset.reset", kmsg.IncrementalAlterConfigOpSet, &value
	rr.Configs = append(rr.Configs, c)
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) == 1 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	return err
}

// kgoMsg is a franz-go record as the raw consumers see it.
func kgoMsg(r *kgo.Record) msg {
	out := msg{body: r.Value}
	for _, h := range r.Headers {
		switch h.Key {
		case kafkaIDHeader:
			out.id = string(h.Value)
		case headerTS:
			out.ts, _ = strconv.ParseInt(string(h.Value), 10, 64)
		}
	}
	return out
}

// handShare is the hand-written share-group consumer on franz-go: one
// member polling at most window records, the poll's records in one
// store transaction (batchTx: one multi-row INSERT … ON CONFLICT DO
// NOTHING claim, one set-based UPDATE, one commit), then AckAccept for
// each and FlushAcks before the next poll. A failed transaction is
// retried in place, as the Kafka baselines do.
func handShare(window int) func(ctx context.Context, e *runEnv, t *tracker) (*counts, error) {
	return func(ctx context.Context, e *runEnv, t *tracker) (*counts, error) {
		k := e.broker.(shareBroker)
		cl, err := kgo.NewClient(
			kgo.SeedBrokers(k.brokers...),
			kgo.ConsumeTopics(e.queue),
			kgo.ShareGroup(e.consumer),
			kgo.ShareMaxRecords(int32(window)),
			kgo.ShareMaxRecordsStrict(),
		)
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		if err := shareStartEarliest(ctx, cl, e.consumer); err != nil {
			return nil, fmt.Errorf("share.auto.offset.reset: %w", err)
		}
		var c counts
		ms := make([]msg, 0, window)
		for {
			fs := cl.PollRecords(ctx, window)
			if ctx.Err() != nil {
				return &c, nil
			}
			if err := fs.Err0(); err != nil && !errors.Is(err, context.Canceled) {
				return &c, err
			}
			recs := fs.Records()
			if len(recs) == 0 {
				continue
			}
			ms = ms[:0]
			for _, r := range recs {
				ms = append(ms, kgoMsg(r))
			}
			var won int
			for {
				if won, err = e.store.batchTx(ctx, e, ms); err == nil {
					break
				}
				if ctx.Err() != nil {
					return &c, nil
				}
				c.retried.Add(int64(len(ms)))
				time.Sleep(10 * time.Millisecond)
			}
			c.processed.Add(int64(won))
			c.duplicates.Add(int64(len(ms) - won))
			for i := range ms {
				t.decided(ms[i].id, ms[i].ts) // at the commit, before the acknowledgement
			}
			t.batches.Add(1)
			for _, r := range recs {
				r.Ack(kgo.AckAccept)
			}
			if err := cl.FlushAcks(ctx); err != nil {
				if ctx.Err() != nil {
					return &c, nil
				}
				return &c, fmt.Errorf("acknowledging: %w", err)
			}
		}
	}
}

// idemqShare is idemq's Consumer over kafka+share:// with the Postgres store:
// window records a poll (core.WithWindow), batches of up to window
// messages, a BatchHandler with one set-based UPDATE … FROM unnest per
// batch queued with the COMMIT (as the idemq-batch configuration on
// Postgres).
func idemqShare(window int) func(ctx context.Context, e *runEnv, t *tracker) (*counts, error) {
	return func(ctx context.Context, e *runEnv, t *tracker) (*counts, error) {
		stages := &stageTimer{t: t}
		opts := []core.Option{
			core.WithName(e.consumer),
			core.WithLogger(e.logger),
			core.WithObserver(stages),
			core.WithBatchSize(window),
			core.WithWindow(window),
			core.WithConcurrency(1),
			// A poll's records arrive together: a moment's wait puts
			// them in one batch, as the hand-written consumer's one
			// transaction per poll.
			core.WithLinger(time.Millisecond),
		}
		setUpdate := `UPDATE ` + e.accountsTable + ` a SET balance_cents = a.balance_cents + v.amt
FROM (SELECT unnest($1::text[]) AS acc, unnest($2::bigint[]) AS amt) v WHERE a.account = v.acc`
		bh := func(ctx context.Context, tx pgx.Tx, msgs []*core.Message) error {
			accs, amts, err := coreSums(msgs)
			if err != nil {
				return err
			}
			return postgres.Queue(ctx, tx, setUpdate, accs, amts)
		}
		build := func(src driver.Source, store driver.Store[pgx.Tx]) (*core.Consumer[pgx.Tx], error) {
			return core.NewBatch(src, store, bh, opts...)
		}
		return runConsumer(ctx, e, e.store.idemqStoreURL(e.dedupTable, 3), stages, build, nil)
	}
}

// shareReport runs the hand-written and the idemq share-group consumers
// rounds times each, alternated, on n unique messages (+20% copies)
// published to a kfake cluster and applied to the Postgres at pgURL, for
// each window; it returns the report with the ratio idemq / hand of
// every window.
func shareReport(tb testing.TB, pgURL string, n, rounds, paced int, windows []int) *Report {
	tb.Helper()
	addr := servicetest.StartKfake(tb, "-brokers", "1",
		"-config", "group.share.heartbeat.interval.ms=200",
		"-config", "group.share.session.timeout.ms=3000")
	cfg, err := Config{
		Broker: "kafka://" + addr + "/idemq-bench-share?partitions=8", Store: pgURL,
		N: n, Duplicates: 0.2, Accounts: 1000, Repeat: rounds,
		LatencyRate: 500, LatencyMessages: paced,
	}.withDefaults()
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bu, _ := url.Parse(cfg.Broker)
	kb, err := newKafka(bu)
	if err != nil {
		tb.Fatal(err)
	}
	store, err := openStore(ctx, cfg.Store)
	if err != nil {
		tb.Fatal(err)
	}
	defer store.close()
	var progress lockedBuffer
	cfg.Progress = &progress
	s := &session{cfg: cfg, broker: shareBroker{kb}, store: store, logger: discardLogger}
	s.rssHWM = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	defer func() { tb.Log("\n" + progress.String()) }()

	rep := &Report{Started: time.Now()}
	rep.Machine = Machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, GoVersion: runtime.Version(), NumCPU: runtime.NumCPU(), LoadStart: loadAvg(),
		Database: store.version(ctx), Broker: s.broker.version(ctx)}
	if s.rssHWM {
		rep.Machine.RSSMethod = "VmHWM of the benchmark process (consumer under test, in-process; kfake in a process of its own), reset before each run"
	} else {
		rep.Machine.RSSMethod = "VmRSS of the benchmark process sampled every 10ms during each run"
	}
	rep.Params = Params{
		Broker: core.Redact(cfg.Broker), Store: core.Redact(cfg.Store), N: cfg.N, Duplicates: cfg.Duplicates,
		Deliveries: cfg.N + cfg.duplicates(), Accounts: cfg.Accounts, BatchSize: windows[0], BatchWorkers: 1,
		Repeat: rounds, LatencyRate: cfg.LatencyRate, LatencyMessages: paced,
	}
	type pair struct{ hand, idemq string }
	var pairs []pair
	for _, w := range windows {
		p := pair{fmt.Sprintf("hand-share-w%d", w), fmt.Sprintf("idemq-share-w%d", w)}
		pairs = append(pairs, p)
		rep.Params.Configs = append(rep.Params.Configs, p.hand, p.idemq)
		rep.Results = append(rep.Results,
			&Result{Name: p.hand, Baseline: true, Description: fmt.Sprintf("hand-written franz-go share-group consumer: 1 member, polls of up to %d records, 1 claim + 1 set-based UPDATE + 1 commit per poll, then AckAccept each and FlushAcks", w)},
			&Result{Name: p.idemq, Description: fmt.Sprintf("idemq Consumer over kafka+share://: window %d, batches of up to %d, set-based BatchHandler", w, w)})
	}
	for rnd := 1; rnd <= rounds; rnd++ {
		for i, p := range pairs {
			sides := []struct {
				name    string
				consume func(context.Context, *runEnv, *tracker) (*counts, error)
			}{{p.hand, handShare(windows[i])}, {p.idemq, idemqShare(windows[i])}}
			if rnd%2 == 0 {
				sides[0], sides[1] = sides[1], sides[0]
			}
			for _, side := range sides {
				s.progress("%s, run %d of %d", side.name, rnd, rounds)
				res := s.runOne(ctx, side.name, runSpec{n: cfg.N, dups: cfg.duplicates(), paced: paced, consume: side.consume})
				s.progress("    %s", res.line())
				r := rep.result(side.name)
				r.Runs = append(r.Runs, res)
			}
		}
	}
	rep.finishAll()
	for _, p := range pairs {
		a, b := rep.result(p.idemq), rep.result(p.hand)
		if a.Failed != "" || b.Failed != "" || b.MsgsPerSec.Median == 0 {
			continue
		}
		v := a.MsgsPerSec.Median / b.MsgsPerSec.Median
		rep.Ratios = append(rep.Ratios, Ratio{Name: p.idemq + " / " + p.hand, Metric: "msgs/s", Value: v, Target: "≥ 1.00", Met: v >= 1})
	}
	rep.Finished, rep.Machine.LoadEnd = time.Now(), loadAvg()
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		tb.Fatal(err)
	}
	tb.Log("\n" + table.String())
	for _, r := range rep.Results {
		if r.Failed != "" {
			tb.Errorf("%s failed: %s", r.Name, r.Failed)
		}
	}
	return rep
}

// BenchmarkKafkaShare compares the hand-written franz-go share-group
// consumer with idemq over kafka+share://: 200,000 unique messages (+20%
// copies), windows 256 and 500, three runs of each side per window
// (alternated: the hand side first in odd rounds, idemq first in even), on a
// kfake cluster and IDEMQ_POSTGRES_URL (default the local server). Run it
// once: -bench KafkaShare -benchtime 1x.
func BenchmarkKafkaShare(b *testing.B) {
	pgURL := servicetest.PostgresURL(b)
	for b.Loop() {
		rep := shareReport(b, pgURL, 200_000, 3, 200, []int{256, 500})
		for _, r := range rep.Results {
			b.ReportMetric(r.MsgsPerSec.Median, r.Name+"-msgs/s")
		}
		for _, x := range rep.Ratios {
			b.ReportMetric(x.Value, strings.ReplaceAll(x.Name, " ", "")+"-ratio")
		}
	}
}

// TestKafkaShareSmall runs the share-group comparison shrunk (300 unique
// messages, window 64) and checks that both sides pass the exactly-once
// check and that the ratio is reported.
func TestKafkaShareSmall(t *testing.T) {
	rep := shareReport(t, servicetest.PostgresURL(t), 300, 1, 20, []int{64})
	if len(rep.Ratios) != 1 || rep.Ratios[0].Value <= 0 {
		t.Errorf("ratios %+v, want one of idemq to hand", rep.Ratios)
	}
	for _, r := range rep.Results {
		if len(r.Runs) != 1 || r.Runs[0].Processed+r.Runs[0].Duplicates < 360 {
			t.Errorf("%s: %+v, want 360 deliveries decided", r.Name, r.Runs)
		}
	}
}
