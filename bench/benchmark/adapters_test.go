package benchmark

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemq/idemq/internal/servicetest"
)

// The tests below run every configuration once on a small workload for
// each broker and store beside RabbitMQ → Postgres, against the real
// services: MariaDB from IDEMQ_MYSQL_URL (default the local one), Kafka as
// an in-process kfake cluster, SQS as the fauxqs emulator that the test
// starts with node (installed by `npm ci` in brokers/sqs/internal/fauxqs).

// mysqlURL returns IDEMQ_MYSQL_URL (default the local MariaDB) as a
// mysql:// URL (a driver DSN is converted), skipping or, with
// IDEMQ_REQUIRE_SERVICES=1, failing when the server does not answer.
func mysqlURL(t *testing.T) string {
	t.Helper()
	v := servicetest.MySQLURL(t)
	if strings.HasPrefix(v, "mysql://") {
		return v
	}
	cfg, err := servicetest.ParseMySQL(v)
	if err != nil {
		t.Fatalf("IDEMQ_MYSQL_URL: %v", err)
	}
	u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + cfg.DBName, User: url.User(cfg.User)}
	if cfg.Passwd != "" {
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	}
	return u.String()
}

// kafkaURL starts an in-process kfake cluster for the test and returns a
// kafka:// URL for it.
func kafkaURL(t *testing.T) string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return "kafka://" + strings.Join(c.ListenAddrs(), ",") + "/idemq-bench-test?partitions=4"
}

// fauxqsDir is where `npm ci` installs the SQS emulator.
var fauxqsDir = filepath.Join("..", "..", "brokers", "sqs", "internal", "fauxqs")

// sqsURL starts fauxqs on a free loopback port (stopped when the test
// ends) and returns an sqs:// URL for it. Without node or fauxqs the test
// is skipped, or fails with IDEMQ_REQUIRE_SERVICES=1.
func sqsURL(t *testing.T) string {
	t.Helper()
	f, err := servicetest.StartFauxqs(fauxqsDir)
	if err != nil {
		msg := fmt.Sprintf("no SQS emulator (needs node and `npm ci` in brokers/sqs/internal/fauxqs): %v", err)
		if servicetest.Required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(f.Stop)
	return "sqs://test:test@idemq-bench-test?region=us-east-1&endpoint=" + url.QueryEscape(f.URL)
}

// lockedBuffer is a bytes.Buffer safe for concurrent writes (the progress
// lines).
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// allConfigs is every default configuration, baselines and idemq.
var allConfigs = DefaultConfigs

// runSmall runs configs once each on n unique messages (+20%) from broker
// into store and checks every one passed its correctness check, with the
// expected results, ratios and report.
func runSmall(t *testing.T, broker, store string, n, batch int, configs []string) *Report {
	t.Helper()
	var progress lockedBuffer
	// Cancelled after 3 minutes but without a deadline, as the benchmark
	// command runs: nats.go's flushes and requests refuse a context
	// without one.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer time.AfterFunc(3*time.Minute, cancel).Stop()
	rep, err := Run(ctx, Config{
		Broker: broker, Store: store,
		N: n, Duplicates: 0.2, Accounts: 50, BatchSize: batch, Repeat: 1,
		LatencyRate: 500, LatencyMessages: 50,
		Configs: configs, Progress: io.Writer(&progress),
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
	for i, r := range rep.Results {
		if r.Name != configs[i] {
			t.Errorf("result %d is %s, want %s", i, r.Name, configs[i])
		}
		if r.Failed != "" {
			t.Errorf("%s failed: %s", r.Name, r.Failed)
			continue
		}
		run := r.Runs[0]
		if r.MsgsPerSec.Median <= 0 || r.P99 <= 0 {
			t.Errorf("%s: incomplete figures: %+v", r.Name, r)
		}
		if r.Name != RawAck && run.Processed != int64(n)+50 {
			t.Errorf("%s: %d processed, want %d (each unique message applied once)", r.Name, run.Processed, n+50)
		}
		if !strings.Contains(table.String(), r.Name) {
			t.Errorf("table lacks %s", r.Name)
		}
	}
	want := map[string]bool{"idemq-batch / hand-batch": true, "idemq-b1-w5 / seed-p5": true, "idemq-b1-w100-c8 / seed-p100-w8": true}
	for _, x := range rep.Ratios {
		delete(want, x.Name)
	}
	if len(want) > 0 {
		t.Errorf("ratios missing: %v", want)
	}
	return rep
}

func TestRunRabbitMySQL(t *testing.T) {
	amqpURL := servicetest.RabbitMQURL(t)
	my := mysqlURL(t)
	u, _ := url.Parse(amqpURL)
	q := u.Query()
	q.Set("queue", "idemq-bench-test")
	u.RawQuery = q.Encode()
	rep := runSmall(t, u.String(), my, 300, 50, allConfigs)
	if !strings.Contains(rep.Machine.Database, "MariaDB") && !strings.Contains(rep.Machine.Database, "MySQL") {
		t.Errorf("database %q", rep.Machine.Database)
	}
}

func TestRunKafkaPostgres(t *testing.T) {
	pgURL := servicetest.PostgresURL(t)
	runSmall(t, kafkaURL(t), pgURL, 300, 50, allConfigs)
}

// TestRunNATSPostgres runs every configuration on the NATS server at
// IDEMQ_NATS_URL (default the local one, with JetStream) into Postgres.
func TestRunNATSPostgres(t *testing.T) {
	natsURL := servicetest.NATSURL(t)
	pgURL := servicetest.PostgresURL(t)
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatalf("IDEMQ_NATS_URL: %v", err)
	}
	u.Path = "/idemq-bench-test"
	rep := runSmall(t, u.String(), pgURL, 300, 50, allConfigs)
	if !strings.Contains(rep.Machine.Broker, "nats-server") {
		t.Errorf("broker %q", rep.Machine.Broker)
	}
	for _, r := range rep.Results {
		if r.Name == IdemqB1W5 || r.Name == IdemqBatch {
			if run := r.Runs[0]; run.Duplicates != 60 {
				t.Errorf("%s: %d duplicates decided, want the 60 copies published", r.Name, run.Duplicates)
			}
		}
	}
}

// TestRunRedisPostgres runs every configuration on the Redis server at
// IDEMQ_REDIS_URL (default the local one) into Postgres; each run's stream
// is deleted with its dead-letter stream afterwards.
func TestRunRedisPostgres(t *testing.T) {
	redisURL := servicetest.URL(t, "IDEMQ_REDIS_URL", "redis://127.0.0.1:6379", func(ctx context.Context, u string) error {
		o, err := goredis.ParseURL(u)
		if err != nil {
			return err
		}
		c := goredis.NewClient(o)
		defer c.Close()
		return c.Ping(ctx).Err()
	})
	pgURL := servicetest.PostgresURL(t)
	u, err := url.Parse(redisURL)
	if err != nil {
		t.Fatalf("IDEMQ_REDIS_URL: %v", err)
	}
	u.Path = "/idemq-bench-test"
	rep := runSmall(t, u.String(), pgURL, 300, 50, allConfigs)
	if !strings.Contains(rep.Machine.Broker, "redis-server") {
		t.Errorf("broker %q", rep.Machine.Broker)
	}
	for _, r := range rep.Results {
		if r.Name == IdemqB1W5 || r.Name == IdemqBatch || r.Name == HandBatch || r.Name == SeedP5 {
			if run := r.Runs[0]; run.Duplicates != 60 {
				t.Errorf("%s: %d duplicates decided, want the 60 copies published", r.Name, run.Duplicates)
			}
		}
	}
}

func TestRunSQSPostgres(t *testing.T) {
	pgURL := servicetest.PostgresURL(t)
	rep := runSmall(t, sqsURL(t), pgURL, 300, 10, allConfigs)
	if rep.Params.BatchSize != 10 {
		t.Errorf("batch %d", rep.Params.BatchSize)
	}
}

// TestConfigSchemes checks that a broker, a store or a batch size the
// benchmark cannot run fails before connecting, naming the field.
func TestConfigSchemes(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Broker: "mqtt://127.0.0.1:1883/x", Store: "postgres://h/db"}, "Config.Broker: scheme \"mqtt\""},
		{Config{Broker: "nats://127.0.0.1:4222/x?consumer=c", Store: "postgres://h/db"}, "parameter consumer is set per run"},
		{Config{Broker: "redis://127.0.0.1:6379/x?group=g", Store: "postgres://h/db"}, "parameter group is set per run"},
		{Config{Broker: "rediss://127.0.0.1:6379/x?id_field=order_id", Store: "postgres://h/db"}, "parameter id_field is set per run"},
		{Config{Broker: "amqp://h/", Store: "sqlite:///tmp/x.db"}, "Config.Store: scheme \"sqlite\""},
		{Config{Broker: "sqs://q?endpoint=http://127.0.0.1:1", Store: "mysql://root@h/db", BatchSize: 11}, "Config.BatchSize: 11 is outside 1..10"},
		{Config{Broker: "pubsub://p/bench", Store: "mysql://root@h/db", BatchSize: 1001}, "Config.BatchSize: 1001 is outside 1..1000"},
		{Config{Broker: "pubsub://p/bench?topic=t", Store: "postgres://h/db"}, "parameter topic is set per run"},
	} {
		_, err := Run(ctx, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
	if cfg, err := (Config{Broker: "sqs://q", Store: "mysql://h/db"}).withDefaults(); err != nil || cfg.BatchSize != 10 {
		t.Errorf("sqs default batch: %d, %v", cfg.BatchSize, err)
	}
}
