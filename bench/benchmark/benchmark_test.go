package benchmark

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serviceURL returns the URL of a service from its environment variable or
// the local default, skipping (or, with IDEMQ_REQUIRE_SERVICES=1, failing)
// when nothing listens there.
func serviceURL(t *testing.T, env, def string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		u = def
	}
	host := "127.0.0.1:0"
	if p, err := url.Parse(u); err == nil && p.Host != "" {
		host = p.Host
	}
	c, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		if os.Getenv("IDEMQ_REQUIRE_SERVICES") == "1" {
			t.Fatalf("%s: %s unreachable: %v", env, host, err)
		}
		t.Skipf("%s: %s unreachable (set %s, or IDEMQ_REQUIRE_SERVICES=1 to fail): %v", env, host, env, err)
	}
	c.Close()
	return u
}

// rabbitPostgresURLs returns the RabbitMQ URL (with the test's queue) and
// the Postgres URL the RabbitMQ → Postgres tests run on.
func rabbitPostgresURLs(t *testing.T) (*url.URL, string) {
	t.Helper()
	amqpURL := serviceURL(t, "IDEMQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	pgURL := serviceURL(t, "IDEMQ_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
	u, _ := url.Parse(amqpURL)
	q := u.Query()
	q.Set("queue", "idemq-bench-test")
	u.RawQuery = q.Encode()
	return u, pgURL
}

// runRabbitPostgres runs cfg from RabbitMQ into Postgres (the URLs of
// rabbitPostgresURLs) within 3 minutes, logs its progress, and fails the
// test when Run fails.
func runRabbitPostgres(t *testing.T, cfg Config) *Report {
	t.Helper()
	u, pgURL := rabbitPostgresURLs(t)
	cfg.Broker, cfg.Store = u.String(), pgURL
	var progress lockedBuffer
	cfg.Progress = &progress
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	t.Log("\n" + progress.String())
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestRunSmall(t *testing.T) {
	u, pgURL := rabbitPostgresURLs(t)

	var progress bytes.Buffer
	configs := []string{SeedP5, HandBatch, RawAck, IdemqB1W5, IdemqQueue, IdemqBatch}
	if s := os.Getenv("IDEMQ_BENCH_CONFIGS"); s != "" {
		configs = strings.Split(s, ",")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{
		Broker: u.String(), Store: pgURL,
		N: 2000, Duplicates: 0.2, Accounts: 50, BatchSize: 100, Repeat: 1,
		LatencyRate: 500, LatencyMessages: 100,
		Configs: configs, Progress: &progress,
	})
	t.Log("\n" + progress.String())
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + table.String())
	if len(rep.Results) != len(configs) {
		t.Fatalf("%d results for %d configurations", len(rep.Results), len(configs))
	}
	for _, r := range rep.Results {
		if r.Failed != "" {
			t.Errorf("%s failed: %s", r.Name, r.Failed)
			continue
		}
		if len(r.Runs) != 1 || r.MsgsPerSec.Median <= 0 || r.P99 <= 0 || r.P50 > r.P99 || r.UserCPU <= 0 {
			t.Errorf("%s: incomplete figures: %+v", r.Name, r)
		}
		if !strings.Contains(table.String(), r.Name) {
			t.Errorf("table lacks %s", r.Name)
		}
	}
	cpuRatio := false
	for _, x := range rep.Ratios {
		cpuRatio = cpuRatio || (x.Metric == "user CPU/msg" && x.Name == IdemqBatch+" / "+HandBatch && x.Value > 0)
	}
	if !cpuRatio {
		t.Errorf("no user CPU ratio of %s to %s: %+v", IdemqBatch, HandBatch, rep.Ratios)
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Results) != len(configs) {
		t.Fatalf("JSON does not read back: %v", err)
	}
	png := filepath.Join(t.TempDir(), "bench.png")
	if err := rep.WritePNG(png); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(png)
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatalf("not a PNG: %v", err)
	}
	if os.Getenv("IDEMQ_BENCH_KEEP_PNG") != "" {
		os.WriteFile(os.Getenv("IDEMQ_BENCH_KEEP_PNG"), b, 0o644)
	}
}

// TestScenariosSmall runs the memory and growth scenarios shrunk (1,000 vs
// 5,000 queued; 20,000 old rows) and checks they produce their results and
// ratios.
func TestScenariosSmall(t *testing.T) {
	amqpURL := serviceURL(t, "IDEMQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	pgURL := serviceURL(t, "IDEMQ_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
	saved := memorySizes
	memorySizes = [2]int{1000, 5000}
	savedQuiet := quietPaced
	quietPaced = time.Second
	defer func() { memorySizes, quietPaced = saved, savedQuiet }()

	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{
		Broker: amqpURL + "?queue=idemq-bench-test", Store: pgURL,
		N: 1000, Accounts: 20, BatchSize: 50, Repeat: 1, GrowthRows: 20_000,
		LatencyRate: 500, LatencyMessages: 50,
		Configs: []string{MemoryScenario, GrowthScenario}, Progress: &progress,
	})
	t.Log("\n" + progress.String())
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	rep.WriteTable(&table)
	t.Log("\n" + table.String())
	want := []string{"memory/10k", "memory/1m", "growth/empty", "growth/full", "growth/quiet", "growth/prune"}
	if len(rep.Results) != len(want) {
		t.Fatalf("%d results, want %v", len(rep.Results), want)
	}
	for i, r := range rep.Results {
		if r.Name != want[i] {
			t.Errorf("result %d is %s, want %s", i, r.Name, want[i])
		}
		if r.Failed != "" {
			t.Errorf("%s failed: %s", r.Name, r.Failed)
		}
	}
	ratios := map[string]bool{}
	for _, x := range rep.Ratios {
		ratios[x.Name] = true
	}
	for _, name := range []string{"memory/1m / memory/10k", "growth/full / growth/empty", "growth/prune / growth/quiet"} {
		if !ratios[name] {
			t.Errorf("ratio %s missing: %+v", name, rep.Ratios)
		}
	}
	if r := rep.result("memory/1m"); r != nil && r.PeakRSS <= 0 {
		t.Errorf("memory/1m has no peak RSS")
	}
}

// TestRunWatermill runs the Watermill configuration on a small workload
// from RabbitMQ into Postgres and checks it passes the exactly-once check
// with every unique message applied once and every copy decided a
// duplicate.
func TestRunWatermill(t *testing.T) {
	rep := runRabbitPostgres(t, Config{
		N: 1000, Duplicates: 0.2, Accounts: 50, Repeat: 1,
		LatencyRate: 500, LatencyMessages: 50,
		Configs: []string{Watermill},
	})
	if len(rep.Results) != 1 || rep.Results[0].Name != Watermill {
		t.Fatalf("results %+v, want one for %s", rep.Results, Watermill)
	}
	r := rep.Results[0]
	if r.Failed != "" {
		t.Fatalf("%s failed: %s", r.Name, r.Failed)
	}
	run := r.Runs[0]
	if run.Processed != 1000+50 || run.Duplicates != 200 {
		t.Errorf("processed %d, duplicates %d; want 1050 (each unique message applied once) and 200", run.Processed, run.Duplicates)
	}
	if r.MsgsPerSec.Median <= 0 || r.P99 <= 0 {
		t.Errorf("incomplete figures: %+v", r)
	}
}

// TestWatermillRabbitMQOnly checks that the Watermill configuration fails,
// naming the broker, on a broker other than RabbitMQ.
func TestWatermillRabbitMQOnly(t *testing.T) {
	pgURL := serviceURL(t, "IDEMQ_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
	rep, err := Run(context.Background(), Config{
		Broker: kafkaURL(t), Store: pgURL, N: 10, Repeat: 1, LatencyMessages: 1,
		Configs: []string{Watermill},
	})
	if err != nil {
		t.Fatal(err)
	}
	if f := rep.Results[0].Failed; !strings.Contains(f, "RabbitMQ only") || !strings.Contains(f, "Kafka") {
		t.Errorf("failure %q, want one naming RabbitMQ and Kafka", f)
	}
}

// TestLeasedScenarioSmall runs the leased scenario shrunk (200 messages, a
// provider answering in 100ms) and checks that both runs pass the
// exactly-once check (ledger and provider) and report every figure, within
// the pool's bounds, and the ratio with its target. Which run is faster is
// what the scenario measures, not what a test asserts.
func TestLeasedScenarioSmall(t *testing.T) {
	rep := runRabbitPostgres(t, Config{
		N: 200, Duplicates: 0.2, Accounts: 20, Repeat: 1,
		ProviderDelay: 100 * time.Millisecond, Pool: 10,
		Configs: []string{LeasedScenario},
	})
	var table bytes.Buffer
	rep.WriteTable(&table)
	t.Log("\n" + table.String())
	if len(rep.Results) != 2 || rep.Results[0].Name != leasedInTx || rep.Results[1].Name != leasedLeased {
		t.Fatalf("results %+v, want %s and %s", rep.Results, leasedInTx, leasedLeased)
	}
	for _, r := range rep.Results {
		if r.Failed != "" {
			t.Fatalf("%s failed: %s", r.Name, r.Failed)
		}
		run := r.Runs[0]
		if run.Deliveries != 240 || run.MsgsPerSec <= 0 || run.Samples == 0 || run.PeakOpenTx < 1 || run.PeakPoolConns < 1 {
			t.Errorf("%s: incomplete figures: %+v", r.Name, run)
		}
		if run.PeakPoolConns > 10 || run.PeakOpenTx > 10 {
			t.Errorf("%s: %d connections acquired, %d transactions open at the peak: more than the pool of 10", r.Name, run.PeakPoolConns, run.PeakOpenTx)
		}
	}
	ratio := false
	for _, x := range rep.Ratios {
		ratio = ratio || (x.Name == leasedLeased+" / "+leasedInTx && x.Target == "≥ 10" && x.Value > 0)
	}
	if !ratio {
		t.Errorf("no ratio of %s to %s: %+v", leasedLeased, leasedInTx, rep.Ratios)
	}
	for _, col := range []string{"open tx peak", "tx time/msg", "pool conns peak", "provider answering each charge in 100ms"} {
		if !strings.Contains(table.String(), col) {
			t.Errorf("table lacks %q", col)
		}
	}
}

// TestRunFranzBaselines runs the franz-go baselines on a small workload
// from Kafka into Postgres: each passes the exactly-once check with every
// unique message applied once and every copy (and every record read again
// after a rebalance) decided a duplicate, and the
// ratios against them are reported. On another broker they fail, naming
// it.
func TestRunFranzBaselines(t *testing.T) {
	pgURL := serviceURL(t, "IDEMQ_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
	rep, err := Run(context.Background(), Config{
		Broker: kafkaURL(t), Store: pgURL, N: 600, Duplicates: 0.2, Accounts: 50, Repeat: 1,
		LatencyRate: 500, LatencyMessages: 20, BatchSize: 50,
		Configs: []string{SeedFranz, HandBatchFranz, IdemqBatch},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Failed != "" {
			t.Fatalf("%s failed: %s", r.Name, r.Failed)
		}
		// A record read again after a rebalance moved its partition before
		// the member committed its offset is decided a duplicate too, so
		// the copies published are the least number of duplicates.
		if run := r.Runs[0]; run.Processed != 600+20 || run.Duplicates < 120 || run.Duplicates > run.Processed {
			t.Errorf("%s: processed %d, duplicates %d; want 620 and at least the 120 copies published", r.Name, run.Processed, run.Duplicates)
		}
	}
	want := map[string]bool{IdemqBatch + " / " + HandBatchFranz: true}
	for _, x := range rep.Ratios {
		delete(want, x.Name)
	}
	if len(want) > 0 {
		t.Errorf("ratios missing: %v", want)
	}
	rep = runRabbitPostgres(t, Config{N: 10, Repeat: 1, LatencyMessages: 1, Configs: []string{HandBatchFranz}})
	if f := rep.Results[0].Failed; !strings.Contains(f, "Kafka only") || !strings.Contains(f, "RabbitMQ") {
		t.Errorf("failure %q, want one naming Kafka and RabbitMQ", f)
	}
}
