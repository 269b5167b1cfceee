package sqs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/middleware/logging"
	"github.com/idemq/idemq/middleware/tracing"
	_ "github.com/idemq/idemq/stores/sqlite"
)

// TestSecretKeyNeverLeaves consumes through sqs:// URLs that carry a
// static access key and secret (opened by core, as a deployment would),
// through a duplicate, a retry and a dead letter, then opens URLs that
// fail; the secret key appears in no log line (debug level, default
// logger included), error or span.
func TestSecretKeyNeverLeaves(t *testing.T) {
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, false, 30, 0)
	secret := "awsS3cret" + randomHex(8)
	logs := &servicetest.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	prev := slog.Default()
	slog.SetDefault(logger)
	t.Cleanup(func() { slog.SetDefault(prev) })
	var errs []string
	var mu sync.Mutex
	addErr := func(what string, err error) {
		if err != nil {
			mu.Lock()
			errs = append(errs, what+": "+err.Error())
			mu.Unlock()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := fmt.Sprintf("sqs://AKIDTEST:%s@%s?endpoint=%s&region=us-east-1", secret, q.name, ep)
	src, err := core.OpenSource(ctx, base+"&dlq="+dlq.name+"&wait=1s&visibility=5s")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := core.OpenPublisher(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	store, err := core.OpenStore[*sql.Tx](ctx, "sqlite://"+filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	var applied atomic.Int32
	var flaky atomic.Int32
	handler := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		switch m.ID {
		case "poison":
			return core.Permanent(errors.New("poison"))
		case "flaky":
			if flaky.Add(1) == 1 {
				return errors.New("flaky once")
			}
		}
		applied.Add(1)
		return nil
	}
	rec := tracetest.NewSpanRecorder()
	tr, err := tracing.New(tracing.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))))
	if err != nil {
		t.Fatal(err)
	}
	record := core.DecisionFunc(func(ctx context.Context, m *core.Message, out core.Outcome) {
		addErr("outcome", out.Err)
	})
	logObs, err := logging.New(logger)
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New[*sql.Tx](src, store, handler, core.WithName("sec"), core.WithLogger(logger),
		core.WithBackoff(core.ExponentialBackoff{Initial: 50 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2}),
		core.WithObserver(tr, record, logObs))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "a", "flaky", "poison"} {
		if err := pub.Publish(ctx, "", &core.Message{ID: id, Body: []byte("body " + id)}); err != nil {
			t.Fatal(err)
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st := c.Stats()
		if applied.Load() == 3 && st.DeadLettered == 1 && st.Duplicates == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, applied %d", st, applied.Load())
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 20*time.Second)
	defer cancelShort()
	_, err = core.OpenSource(short, fmt.Sprintf("sqs://AKIDTEST:%s@no-such-queue-%s?endpoint=%s&region=us-east-1", secret, randomHex(4), ep))
	addErr("missing queue", err)
	_, err = core.OpenSource(short, fmt.Sprintf("sqs://AKIDTEST:%s@q?endpoint=http://127.0.0.1:1&region=us-east-1", secret))
	addErr("unreachable", err)
	_, err = Open(short, "sqs://q", WithStaticCredentials("AKIDTEST", secret, ""), WithEndpoint("http://127.0.0.1:1"), WithRegion("us-east-1"))
	addErr("sqs.Open direct, unreachable", err)
	_, err = core.OpenSource(short, fmt.Sprintf("sqs://AKIDTEST:%s@q?endpoint=%s&bogus=1", secret, ep))
	addErr("unknown parameter", err)

	var spans strings.Builder
	for _, s := range rec.Ended() {
		fmt.Fprintln(&spans, s.Name(), s.Status(), s.Attributes(), s.Events())
	}
	mu.Lock()
	all := strings.Join(errs, "\n")
	mu.Unlock()
	if len(errs) < 5 {
		t.Errorf("only %d errors captured:\n%s", len(errs), all)
	}
	for _, w := range []struct{ name, text string }{{"logs", logs.String()}, {"errors", all}, {"spans", spans.String()}} {
		if i := strings.Index(w.text, secret); i >= 0 {
			t.Errorf("secret key found in %s: …%s…", w.name, w.text[max(0, i-200):min(len(w.text), i+60)])
		}
	}
	t.Logf("%d bytes of logs, %d errors, %d spans checked:\n%s", len(logs.String()), len(errs), len(rec.Ended()), all)
}
