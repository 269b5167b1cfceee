package brokertest

import (
	"context"
	"database/sql"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/sqlite"
)

// RetentionAgainstHorizon checks what a Consumer over a source from open
// does when its store keeps claims for retention, less than the broker's
// redelivery horizon (horizon: how the Consumer names it, such as "2h0m0s"
// or "unbounded"): with core.WithStrictRetention, Run refuses to start
// with an error naming both durations; without it, Run warns naming both,
// then consumes.
func RetentionAgainstHorizon(t *testing.T, open func(t *testing.T) driver.Source, retention time.Duration, horizon string) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "retention.db"), sqlite.WithRetention(retention))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	nothing := func(context.Context, *sql.Tx, *core.Message) error { return nil }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	src := open(t)
	hint := ""
	if h, ok := src.(driver.HorizonHinter); ok {
		hint = h.HorizonHint(retention)
	}
	c, err := core.New[*sql.Tx](src, st, nothing, core.WithName("retention"), core.WithStrictRetention())
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), retention.String()) || !strings.Contains(err.Error(), horizon) {
		t.Errorf("strict: Run = %v, want an error naming the retention %v and the horizon %q", err, retention, horizon)
	}
	if err != nil && !strings.Contains(err.Error(), hint) {
		t.Errorf("strict: Run = %v, want it to name the fix %q", err, hint)
	}

	if horizon == "unbounded" {
		// Accepted knowingly: no refusal, no warning.
		logs, err := runUntilLogged(ctx, t, open(t), st, "WithUnboundedHorizon", core.WithStrictRetention(), core.WithUnboundedHorizon())
		if err != nil {
			t.Errorf("WithUnboundedHorizon: Run = %v, want it to run", err)
		}
		if strings.Contains(logs, "shorter than the broker's redelivery horizon") {
			t.Errorf("WithUnboundedHorizon: still warned:\n%s", logs)
		}
	}

	l, err := runUntilLogged(ctx, t, open(t), st, "shorter than the broker's redelivery horizon")
	if err != nil {
		t.Errorf("not strict: Run = %v, want it to run after the warning", err)
	}
	if !strings.Contains(l, "retention="+retention.String()) || !strings.Contains(l, horizon) {
		t.Errorf("the warning does not name both durations:\n%s", l)
	}
}

// runUntilLogged runs a Consumer of src on st until its log holds want,
// then stops it, and returns the log and Run's error.
func runUntilLogged(ctx context.Context, t *testing.T, src driver.Source, st driver.Store[*sql.Tx], want string, opts ...core.Option) (string, error) {
	t.Helper()
	logs := &logLines{}
	nothing := func(context.Context, *sql.Tx, *core.Message) error { return nil }
	c, err := core.New[*sql.Tx](src, st, nothing, append([]core.Option{core.WithName("retention"),
		core.WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	waitFor(t, 30*time.Second, want, func() bool { return strings.Contains(logs.String(), want) })
	stop()
	err = <-done
	return logs.String(), err
}

// logLines collects what a logger writes, for reading while it writes.
type logLines struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
