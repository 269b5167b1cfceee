package security

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemq/idemq/brokers/brokertest"
	_ "github.com/idemq/idemq/brokers/kafka"
	"github.com/idemq/idemq/brokers/rabbitmq"
	_ "github.com/idemq/idemq/brokers/sqs"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/internal/tlstest"
	"github.com/idemq/idemq/middleware/logging"
	"github.com/idemq/idemq/middleware/tracing"
	"github.com/idemq/idemq/stores/mysql"
	"github.com/idemq/idemq/stores/postgres"
)

// TestSecretsNeverLeave runs a full consume — RabbitMQ with a user whose
// password is really checked, a private PostgreSQL over verified TLS with
// a scram password — opened by URLs carrying those credentials, through
// a duplicate, a transient failure, a permanent failure (dead letter) and
// a connection closed by the broker (reconnect). Then it provokes the
// error paths that see URLs: wrong passwords, unparseable URLs,
// unreachable hosts for every adapter and store. No secret may appear in
// the captured logs (debug level, every component), in any error, or in
// any exported span.
func TestSecretsNeverLeave(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL server; not in -short")
	}
	base := amqpURL(t)
	if !strings.HasPrefix(base, "amqp://") || !strings.Contains(base, "127.0.0.1") {
		t.Skip("needs the local RabbitMQ node (rabbitmqctl creates a user): IDEMQ_AMQP_URL points elsewhere")
	}
	suffix := randHex(4)
	rmqUser, rmqPass := "idemq_sec_"+suffix, "rmqS3cret-"+randHex(6)
	pgPass := "pgS3cret-" + randHex(6)
	sqsSecret := "awsS3cret-" + randHex(8)
	myPass := "myS3cret-" + randHex(6)
	saslPass := "saslS3cret-" + randHex(6)
	secrets := []string{rmqPass, pgPass, sqsSecret, myPass, saslPass}

	logs := &servicetest.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	prev := slog.Default()
	slog.SetDefault(logger) // adapters opened by URL log to the default logger
	t.Cleanup(func() { slog.SetDefault(prev) })
	var errs []string
	var errMu sync.Mutex
	addErr := func(what string, err error) {
		if err == nil {
			return
		}
		errMu.Lock()
		defer errMu.Unlock()
		errs = append(errs, what+": "+err.Error())
	}

	tlstest.RabbitMQUser(t, rmqUser, rmqPass)
	f := tlstest.Certs(t, "postgres")
	port := tlstest.Postgres(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := pgxpool.New(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=verify-full&sslrootcert=%s", port, f.CA))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE ROLE app LOGIN PASSWORD '%s';
		CREATE TABLE effects (id TEXT PRIMARY KEY);
		GRANT ALL ON effects TO app;
		GRANT CREATE ON SCHEMA public TO app`, pgPass)); err != nil {
		t.Fatal(err)
	}

	queue := "idemq-sec-" + suffix
	amqpSecret := fmt.Sprintf("amqp://%s:%s@127.0.0.1:5672/?queue=%s&connection_name=sec", rmqUser, rmqPass, queue)
	pgSecret := fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/postgres?sslmode=verify-full&sslrootcert=%s&table=sec_claims", pgPass, port, f.CA)
	t.Cleanup(func() {
		conn, err := amqp.Dial(base)
		if err != nil {
			return
		}
		defer conn.Close()
		ch, _ := conn.Channel()
		for _, q := range []string{queue, queue + ".dlq"} {
			ch.QueueDelete(q, false, false, false)
		}
	})

	src, err := core.OpenSource(ctx, amqpSecret)
	if err != nil {
		t.Fatalf("open source: %v", err)
	}
	store, err := core.OpenStore[pgx.Tx](ctx, pgSecret)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	defer store.(*postgres.Store).Close()
	pub, err := core.OpenPublisher(ctx, amqpSecret)
	if err != nil {
		t.Fatalf("open publisher: %v", err)
	}
	defer pub.Close()

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr, err := tracing.New(tracing.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	var flaky atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		switch m.ID {
		case "poison":
			return core.Permanent(errors.New("poison body"))
		case "flaky":
			if flaky.Add(1) == 1 {
				return errors.New("flaky once")
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, m.ID)
		return err
	}
	record := core.DecisionFunc(func(ctx context.Context, m *core.Message, out core.Outcome) {
		addErr("outcome "+m.ID, out.Err)
	})
	logObs, err := logging.New(logger, logging.WithBody(64))
	if err != nil {
		t.Fatal(err)
	}
	opts := []core.Option{
		core.WithName("sec"), core.WithLogger(logger), core.WithBatchSize(4),
		core.WithBackoff(core.ExponentialBackoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond, Multiplier: 2}),
		core.WithObserver(tr, record, logObs)}
	c, err := core.New[pgx.Tx](src, store, handler, opts...)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	ids := []string{"a", "b", "c", "a", "flaky", "poison"}
	publish := func(ids ...string) {
		for _, id := range ids {
			if err := pub.Publish(ctx, "", &core.Message{ID: id, Body: []byte("body of " + id)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(ids...)
	waitEffects := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			var got int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d effects after 30s, want %d", got, n)
			}
		}
	}
	waitEffects(4) // a, b, c, flaky
	// The broker closes our consumer's connection: the source logs the
	// loss and reconnects with the same URL.
	closeConnections(t, rmqUser)
	publish("d", "e")
	waitEffects(6)
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	st := c.Stats()
	if st.Duplicates < 1 || st.DeadLettered != 1 || st.Retried < 1 {
		t.Errorf("stats %+v: want a duplicate, a retry and one dead letter", st)
	}
	if rs, ok := src.(*rabbitmq.Source); ok && rs.Stats().Reconnects < 1 {
		t.Errorf("no reconnect after the broker closed the connection")
	}

	// Error paths that see a URL with its secrets.
	bad := func(what string, open func() error) { addErr(what, open()) }
	short, cancelShort := context.WithTimeout(ctx, 15*time.Second)
	defer cancelShort()
	bad("amqp wrong password", func() error {
		_, err := core.OpenSource(short, strings.Replace(amqpSecret, rmqPass, rmqPass+"x", 1))
		return err
	})
	bad("amqp unreachable", func() error {
		_, err := core.OpenSource(short, fmt.Sprintf("amqp://u:%s@127.0.0.1:1/?queue=q&connection_timeout=500", rmqPass))
		return err
	})
	bad("amqp unparseable", func() error {
		_, err := core.OpenSource(short, fmt.Sprintf("amqp://u:%s@127.0.0.1:notaport/?queue=q", rmqPass))
		return err
	})
	bad("rabbitmq.Open direct, bad port", func() error {
		_, err := rabbitmq.Open(short, fmt.Sprintf("amqp://u:%s@127.0.0.1:99999/?queue=q", rmqPass))
		return err
	})
	bad("rabbitmq.Open direct, unparseable", func() error {
		_, err := rabbitmq.Open(short, fmt.Sprintf("amqp://u:%s@127.0.0.1:notaport/?queue=q", rmqPass))
		return err
	})
	bad("rabbitmq.Open direct with WithQueue, unparseable", func() error {
		_, err := rabbitmq.Open(short, fmt.Sprintf("amqp://u:%s@127.0.0.1:notaport/", rmqPass), rabbitmq.WithQueue("q"))
		return err
	})
	bad("rabbitmq.NewPublisher direct, unparseable", func() error {
		_, err := rabbitmq.NewPublisher(short, fmt.Sprintf("amqp://u:%s@127.0.0.1:notaport/", rmqPass))
		return err
	})
	bad("amqp publisher wrong password", func() error {
		_, err := core.OpenPublisher(short, strings.Replace(amqpSecret, rmqPass, rmqPass+"x", 1))
		return err
	})
	bad("postgres wrong password", func() error {
		_, err := core.OpenStore[pgx.Tx](short, strings.Replace(pgSecret, pgPass, pgPass+"x", 1))
		return err
	})
	bad("postgres.Open direct, wrong password", func() error {
		_, err := postgres.Open(short, strings.Replace(pgSecret, pgPass, pgPass+"x", 1)+"&sslpassword="+saslPass)
		return err
	})
	bad("postgres.Open direct, unparseable", func() error {
		_, err := postgres.Open(short, fmt.Sprintf("postgres://app:%s@127.0.0.1:notaport/db", pgPass))
		return err
	})
	bad("postgres.Open direct, bad parameter", func() error {
		_, err := postgres.Open(short, fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/db?sslmode=bogus", pgPass, port))
		return err
	})
	bad("mysql unreachable", func() error {
		_, err := core.OpenStore[any](short, fmt.Sprintf("mysql://app:%s@127.0.0.1:1/db?timeout=1s", myPass))
		return err
	})
	bad("mysql.Open direct, unreachable", func() error {
		_, err := mysql.Open(short, fmt.Sprintf("mysql://app:%s@127.0.0.1:1/db?timeout=1s", myPass))
		return err
	})
	bad("mysql.Open direct, DSN form", func() error {
		_, err := mysql.Open(short, fmt.Sprintf("app:%s@tcp(127.0.0.1:1)/db?timeout=1s&bogus=1", myPass))
		return err
	})
	bad("mysql.Open direct, unparseable", func() error {
		_, err := mysql.Open(short, fmt.Sprintf("mysql://app:%s@127.0.0.1:notaport/db", myPass))
		return err
	})
	bad("sqs unreachable", func() error {
		_, err := core.OpenSource(short, fmt.Sprintf("sqs://AKIDEXAMPLE:%s@orders?endpoint=http://127.0.0.1:1&region=us-east-1&wait=1s", sqsSecret))
		return err
	})
	bad("sqs publisher unreachable", func() error {
		p, err := core.OpenPublisher(short, fmt.Sprintf("sqs://AKIDEXAMPLE:%s@orders?endpoint=http://127.0.0.1:1&region=us-east-1", sqsSecret))
		if err == nil {
			err = p.Publish(short, "", &core.Message{ID: "x", Body: []byte("x")})
			p.Close()
		}
		return err
	})
	// Kafka over TLS with SCRAM, opened by URLs carrying the password: a
	// round trip, then a wrong password and an unreachable broker.
	kcerts := tlstest.Certs(t, "")
	kafkaAddr := servicetest.StartKfake(t, "-auto-create=false", "-topics", "idemq-sec:1",
		"-tls-cert", kcerts.ServerCert, "-tls-key", kcerts.ServerKey, "-sasl", "SCRAM-SHA-256:idemq:"+saslPass)
	kafkaURL := func(pass, addr string) string {
		return fmt.Sprintf("kafka://idemq:%s@%s/idemq-sec?group=sec&tls=true&ca_file=%s&sasl=scram-sha-256",
			url.QueryEscape(pass), addr, url.QueryEscape(kcerts.CA))
	}
	kpub, err := core.OpenPublisher(short, kafkaURL(saslPass, kafkaAddr))
	if err != nil {
		t.Fatalf("kafka publisher: %v", err)
	}
	if err := kpub.Publish(short, "", &core.Message{ID: "k-1", Body: []byte("k")}); err != nil {
		t.Fatalf("kafka publish: %v", err)
	}
	kpub.Close()
	ksrc, err := core.OpenSource(short, kafkaURL(saslPass, kafkaAddr))
	if err != nil {
		t.Fatalf("kafka source: %v", err)
	}
	kr := brokertest.StartReceiver(t, ksrc, 0)
	kd, err := kr.Receive(short)
	if err != nil {
		t.Fatalf("kafka receive: %v", err)
	}
	if err := kd.DeadLetter(short, errors.New("parked by the secrets test")); err != nil {
		t.Errorf("kafka dead letter: %v", err)
	}
	kr.Close()
	kafkaPublish := func(u string) error {
		ctx, cancel := context.WithTimeout(short, 5*time.Second)
		defer cancel()
		p, err := core.OpenPublisher(ctx, u)
		if err == nil {
			err = p.Publish(ctx, "", &core.Message{ID: "x", Body: []byte("x")})
			p.Close()
		}
		return err
	}
	bad("kafka wrong password", func() error {
		_, err := core.OpenSource(short, kafkaURL(saslPass+"x", kafkaAddr))
		return err
	})
	bad("kafka publisher wrong password", func() error { return kafkaPublish(kafkaURL(saslPass+"x", kafkaAddr)) })
	bad("kafka unreachable", func() error {
		_, err := core.OpenSource(short, kafkaURL(saslPass, "127.0.0.1:1"))
		return err
	})
	bad("kafka publisher unreachable", func() error { return kafkaPublish(kafkaURL(saslPass, "127.0.0.1:1")) })
	bad("kafka password without sasl", func() error {
		_, err := core.OpenSource(short, strings.Replace(kafkaURL(saslPass, kafkaAddr), "&sasl=scram-sha-256", "", 1))
		return err
	})
	bad("unknown scheme with a secret parameter", func() error {
		_, err := core.OpenSource(short, fmt.Sprintf("kafkaz://u:%s@h/?sasl_password=%s", saslPass, saslPass))
		return err
	})

	spans := rec.Ended()
	if len(spans) < 6 {
		t.Errorf("%d spans exported; want one per decision at least", len(spans))
	}
	var spanText strings.Builder
	for _, s := range spans {
		fmt.Fprintln(&spanText, s.Name(), s.Status(), s.Attributes())
		for _, e := range s.Events() {
			fmt.Fprintln(&spanText, e.Name, e.Attributes)
		}
		for _, l := range s.Links() {
			fmt.Fprintln(&spanText, l.Attributes)
		}
	}
	errMu.Lock()
	allErrs := strings.Join(errs, "\n")
	errMu.Unlock()
	if len(errs) < 10 {
		t.Errorf("only %d errors captured; the error paths did not all fail:\n%s", len(errs), allErrs)
	}
	for _, where := range []struct{ name, text string }{
		{"logs", logs.String()}, {"errors", allErrs}, {"spans", spanText.String()},
	} {
		for _, s := range secrets {
			if i := strings.Index(where.text, s); i >= 0 {
				from, to := max(0, i-200), min(len(where.text), i+len(s)+50)
				t.Errorf("secret %q found in %s: …%s…", s, where.name, where.text[from:to])
			}
		}
	}
	t.Logf("checked %d bytes of logs, %d errors, %d spans; errors:\n%s", len(logs.String()), len(errs), len(spans), allErrs)
}

// closeConnections closes, from the broker's side, every connection of
// RabbitMQ user name, and only those (other tests share the node).
func closeConnections(t *testing.T, name string) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "pid", "user").CombinedOutput()
	if err != nil {
		t.Fatalf("list_connections: %v: %s", err, out)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 2 && fields[1] == name {
			if out, err := exec.Command("rabbitmqctl", "close_connection", fields[0], "closed by the secrets test").CombinedOutput(); err != nil {
				t.Fatalf("close_connection: %v: %s", err, out)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no connection of user %s to close", name)
	}
}
