package redis

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/internal/servicetest"
)

// records is a slog handler's JSON output, safe for concurrent writes.
type records struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *records) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.Write(p)
}

// all returns the records written so far.
func (r *records) all(t *testing.T) []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(r.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a JSON record: %q", line)
		}
		out = append(out, rec)
	}
	return out
}

// go-redis's own log lines (here: a dial that failed after its retries)
// come out as structured records through the logger of the source whose
// command met the failure, with the stream, and nowhere else: two sources
// of one process with loggers of their own each get their own line, the
// process-wide go-redis logger notwithstanding.
func TestClientLogThroughTheSourcesLogger(t *testing.T) {
	var outs [2]records
	var wg sync.WaitGroup
	for i := range outs {
		port := servicetest.FreePort(t) // nothing listens there
		wg.Go(func() {
			_, err := Open(context.Background(), fmt.Sprintf("redis://127.0.0.1:%d/logs-%d?group=g", port, i),
				WithLogger(slog.New(slog.NewJSONHandler(&outs[i], nil))))
			if err == nil {
				t.Errorf("source %d opened with nothing listening", i)
			}
		})
	}
	wg.Wait()
	for i := range outs {
		recs := outs[i].all(t)
		found := false
		for _, rec := range recs {
			if rec["stream"] != fmt.Sprintf("logs-%d", i) {
				t.Errorf("source %d's logger got a record of another stream: %v", i, rec)
			}
			if line, _ := rec["line"].(string); strings.Contains(line, "failed to dial") && rec["level"] == "WARN" {
				found = true
			}
		}
		if !found {
			t.Errorf("source %d's logger got no structured record of go-redis's failed dial: %v", i, recs)
		}
	}
}

// A source logs to the logger the Consumer gives it (Setup.Logger) unless
// it was given one of its own (WithLogger), which wins: here the record
// of reading back what the consumer name held.
func TestSourceLogsToTheConsumersLoggerUnlessGivenOne(t *testing.T) {
	for _, own := range []bool{false, true} {
		ts := newTestStream(t, RedisURL(t))
		publish(t, ts, "held")
		readAs(t, ts, "worker", 1)
		var given, consumers records
		opts := []Option{WithGroup("g"), WithConsumer("worker")}
		if own {
			opts = append(opts, WithLogger(slog.New(slog.NewJSONHandler(&given, nil))))
		}
		s, err := Open(context.Background(), ts.url(""), opts...)
		if err != nil {
			t.Fatal(err)
		}
		r, err := brokertest.NewReceiver(context.Background(), s, 10, slog.New(slog.NewJSONHandler(&consumers, nil)))
		if err != nil {
			t.Fatal(err)
		}
		d := receive(t, r, 1)[0]
		d.Ack(context.Background())
		r.Close()
		want, other := &consumers, &given
		if own {
			want, other = &given, &consumers
		}
		found := false
		for _, rec := range want.all(t) {
			found = found || strings.Contains(rec["msg"].(string), "reading back")
		}
		if !found || len(other.all(t)) != 0 {
			t.Errorf("own logger %v: the read-back record went elsewhere: wanted in %v, other got %v", own, want.all(t), other.all(t))
		}
	}
}
