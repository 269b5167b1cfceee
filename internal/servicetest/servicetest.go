// Package servicetest is the one place where idemq's integration tests
// find the real services they run against (Postgres, MariaDB/MySQL,
// RabbitMQ, NATS, …) and decide what to do when one is missing.
//
// Each service is named by an IDEMQ_<NAME>_URL environment variable that
// defaults to the local server. When the service cannot be reached the
// test is skipped with a message naming the variable to set, unless
// IDEMQ_REQUIRE_SERVICES=1, which turns the skip into a failure (for CI,
// where a silently skipped suite would hide a broken service).
//
// Beside the lookups (PostgresURL, MySQLURL, RabbitMQURL, NATSURL, URL for any
// other service, Unavailable for a missing binary or tool) it holds the
// other service plumbing the tests repeated: StartFauxqs runs the SQS
// emulator, StartKfake (and NewKfake, for code without a testing.TB)
// builds and runs bench/cmd/kfake, an in-memory Kafka, in a process of its
// own (with cluster controls: MoveLeader, RemoveBroker, …),
// DeleteQueuesAtCleanup removes a test's RabbitMQ queues,
// DeleteStreamsAtCleanup its JetStream streams, StartNATS runs a private
// nats-server (restarts, security modes), and BenchBinary
// builds a server the bench module holds. For the fault tests it starts
// private servers from the installed binaries, on free loopback ports and
// in temporary directories, never touching the machine's own:
// StartRabbitCluster (a RabbitMQ cluster whose nodes stop and start),
// StartPostgres and StartPostgresPair (a primary with a streaming standby
// to promote), StartMariaDB; StartProxy cuts a connection's next answer.
//
// It is an ordinary package so that test files of every package in the
// module can share it; being internal, nothing outside the module can.
// It imports core (for URL redaction), so package core's own in-package
// tests cannot use it; core's external tests (package core_test) can.
package servicetest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/redact"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// RequireEnv is the variable that, set to "1", makes a missing service
// fail the test instead of skipping it.
const RequireEnv = "IDEMQ_REQUIRE_SERVICES"

// The variables naming each service, and the local servers they default to.
const (
	// PostgresEnv holds the Postgres URL the tests use.
	PostgresEnv = "IDEMQ_POSTGRES_URL"
	// PostgresDefault is the local Postgres server.
	PostgresDefault = "postgres://postgres@127.0.0.1:5432/test"
	// MySQLEnv holds the MariaDB/MySQL server the tests use, as a
	// go-sql-driver DSN or a mysql:// URL.
	MySQLEnv = "IDEMQ_MYSQL_URL"
	// MySQLDefault is the local MariaDB server, as a go-sql-driver DSN.
	MySQLDefault = "root:@tcp(127.0.0.1:3306)/test"
	// RabbitMQEnv holds the AMQP URL of the RabbitMQ broker the tests use.
	RabbitMQEnv = "IDEMQ_AMQP_URL"
	// RabbitMQDefault is the local RabbitMQ broker.
	RabbitMQDefault = "amqp://guest:guest@127.0.0.1:5672/"
	// KafkaEnv holds a real Kafka cluster's brokers; unset, the Kafka tests
	// start bench/cmd/kfake instead (StartKfake).
	KafkaEnv = "IDEMQ_KAFKA_URL"
	// SQSEnv holds a real SQS-protocol endpoint; unset, the SQS tests start
	// the fauxqs emulator instead.
	SQSEnv = "IDEMQ_SQS_URL"
)

// Timeout bounds each reachability check: connecting and pinging.
const Timeout = 5 * time.Second

// Required reports whether IDEMQ_REQUIRE_SERVICES=1, that is whether a
// missing service must fail the test rather than skip it.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Unavailable ends t because a service it needs is missing: t.Skip, or
// t.Fatal when IDEMQ_REQUIRE_SERVICES=1. The message, formatted as by
// fmt.Sprintf, should say what to set or install for the test to run.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatal(msg + " (" + RequireEnv + "=1: failing instead of skipping)")
	}
	t.Skip(msg)
}

// Getenv returns the value of variable, or def when it is unset or empty.
func Getenv(variable, def string) string {
	if v := os.Getenv(variable); v != "" {
		return v
	}
	return def
}

// URL returns the value of variable (def when unset) once ping, given a
// context bounded by Timeout, has reached the service there. When ping
// fails, Unavailable ends t with a message naming variable, the URL with
// its secrets hidden, and the error.
func URL(t testing.TB, variable, def string, ping func(ctx context.Context, url string) error) string {
	t.Helper()
	u := Getenv(variable, def)
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if err := ping(ctx, u); err != nil {
		Unavailable(t, "service unreachable at %s=%s: %s; set %s to a reachable one",
			variable, core.Redact(u), core.RedactError(err, u), variable)
	}
	return u
}

// PostgresURL returns IDEMQ_POSTGRES_URL (default the local server) once a
// pgx connection has reached and pinged it; unreachable, it skips t (or
// fails it with IDEMQ_REQUIRE_SERVICES=1) naming the variable.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return URL(t, PostgresEnv, PostgresDefault, PingPostgres)
}

// MySQLURL returns IDEMQ_MYSQL_URL (default the local MariaDB, as a
// go-sql-driver DSN) once it has been reached and pinged; unreachable, it
// skips t (or fails it with IDEMQ_REQUIRE_SERVICES=1) naming the variable.
// The value is returned as set: a DSN or a mysql:// URL.
func MySQLURL(t testing.TB) string {
	t.Helper()
	return URL(t, MySQLEnv, MySQLDefault, PingMySQL)
}

// RabbitMQURL returns IDEMQ_AMQP_URL (default the local broker) once an
// AMQP connection to it has been opened; unreachable, it skips t (or fails
// it with IDEMQ_REQUIRE_SERVICES=1) naming the variable.
func RabbitMQURL(t testing.TB) string {
	t.Helper()
	return URL(t, RabbitMQEnv, RabbitMQDefault, PingRabbitMQ)
}

// PingPostgres connects to the Postgres server at u with pgx and pings it.
func PingPostgres(ctx context.Context, u string) error {
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}

// PingMySQL connects to the MariaDB/MySQL server at dsn (a go-sql-driver
// DSN or a mysql:// URL) and pings it.
func PingMySQL(ctx context.Context, dsn string) error {
	cfg, err := ParseMySQL(dsn)
	if err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && (cfg.Timeout == 0 || time.Until(d) < cfg.Timeout) {
		cfg.Timeout = time.Until(d)
	}
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		return err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	return db.PingContext(ctx)
}

// PingRabbitMQ opens (and closes) an AMQP connection to the broker at u.
func PingRabbitMQ(ctx context.Context, u string) error {
	timeout := Timeout
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(timeout)})
	if err != nil {
		return err
	}
	return conn.Close()
}

// ParseMySQL reads a go-sql-driver DSN, or a mysql://user:pass@host:port/db
// URL whose query holds go-sql-driver parameters, into a driver config.
// Unlike the store's own parser it knows no store options, so that test
// helpers need not import the store.
func ParseMySQL(s string) (*mysqldrv.Config, error) {
	if !strings.HasPrefix(s, "mysql://") {
		return mysqldrv.ParseDSN(s)
	}
	u, err := redact.ParseURL(s)
	if err != nil {
		return nil, fmt.Errorf("mysql URL: %w", err)
	}
	cfg := mysqldrv.NewConfig()
	// Keep the parameters the driver knows (timeouts, tls=true…). Those it
	// does not know it would send as session variables: they are store
	// options (table=…), not for a ping, so they are dropped.
	if c, err := mysqldrv.ParseDSN("/?" + u.RawQuery); u.RawQuery != "" && err == nil {
		c.Params = nil
		cfg = c
	}
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
	if u.Port() == "" {
		cfg.Addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	return cfg, nil
}

// WaitFor polls cond until it holds, failing t after timeout with what it
// waited for.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
