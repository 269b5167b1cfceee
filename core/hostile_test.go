package core_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/logging"
	"github.com/idemq/idemq/middleware/tracing"
)

// hostileRow is one hostile message and how it must end.
type hostileRow struct {
	name    string
	msg     *core.Message
	applied bool   // processed: its effect is in the table, once
	cause   error  // dead-lettered: errors.Is(cause)
	text    string // dead-lettered: the cause says this
}

func hostileRows() []hostileRow {
	body := []byte(`{"amount":1}`)
	headers := make(map[string]string, 10000)
	for i := range 10000 {
		headers[fmt.Sprintf("x-h-%05d", i)] = "v"
	}
	msg := func(id string) *core.Message { return &core.Message{ID: id, Body: body} }
	withHeaders := func(id string, h map[string]string) *core.Message {
		return &core.Message{ID: id, Body: body, Headers: h}
	}
	return []hostileRow{
		// Valid ids, however odd: processed normally, stored verbatim.
		{name: "sql quote and comment", msg: msg(`x'); DROP TABLE effects; --`), applied: true},
		{name: "sql double quote or", msg: msg(`" OR "1"="1`), applied: true},
		{name: "sql wildcard and backslash", msg: msg(`%_\'\\`), applied: true},
		{name: "sql semicolon batch", msg: msg(`1; DELETE FROM processed_messages`), applied: true},
		{name: "newline (log injection)", msg: msg("a\nlevel=ERROR msg=forged"), applied: true},
		{name: "unicode and bidi override", msg: msg("päyment-\u202e-💳"), applied: true},
		{name: "blank", msg: msg(" "), applied: true},
		{name: "255 bytes, the maximum", msg: msg(strings.Repeat("m", 255)), applied: true},
		{name: "malformed traceparent", msg: withHeaders("trace-bad", map[string]string{"traceparent": "00-zzzz-not-a-trace-!!", "tracestate": "=,=,=;;"}), applied: true},
		{name: "huge traceparent", msg: withHeaders("trace-huge", map[string]string{"traceparent": "00-" + strings.Repeat("f", 64<<10) + "-01"}), applied: true},
		{name: "traceparent with NUL and invalid UTF-8", msg: withHeaders("trace-bytes", map[string]string{"traceparent": "00-\x00\xff\xfe-01", "baggage": strings.Repeat("k=v,", 10000)}), applied: true},
		// Hostile ids and messages: dead-lettered with their reason.
		{name: "empty id", msg: msg(""), cause: core.ErrMissingID, text: "no id"},
		{name: "NUL byte in id", msg: msg("a\x00b"), cause: core.ErrInvalidID, text: "NUL"},
		{name: "invalid UTF-8 id", msg: msg("a\xff\xfeb"), cause: core.ErrInvalidID, text: "UTF-8"},
		{name: "256 bytes", msg: msg(strings.Repeat("m", 256)), cause: core.ErrInvalidID, text: "256 bytes, the maximum is 255"},
		{name: "1 MiB id", msg: msg(strings.Repeat("i", 1<<20)), cause: core.ErrInvalidID, text: "1048576 bytes"},
		{name: "body over the maximum", msg: &core.Message{ID: "big-body", Body: make([]byte, 256<<10)}, cause: core.ErrTooLarge, text: "body of 262144 bytes, at most 65536"},
		{name: "ten thousand headers", msg: withHeaders("many-headers", headers), cause: core.ErrTooLarge, text: "10000 headers, at most 1000"},
		{name: "undecodable body", msg: &core.Message{ID: "not-json", Body: []byte("{\x00")}, cause: errUndecodable, text: "invalid character"},
	}
}

var errUndecodable = errors.New("undecodable body")

// decodeEffect is a handler that decodes JSON as a real one would: a body
// it cannot decode is a permanent error.
func decodeEffect(ctx context.Context, tx *sql.Tx, m *core.Message) error {
	var p struct{ Amount int }
	if err := json.Unmarshal(m.Body, &p); err != nil {
		return core.Permanent(fmt.Errorf("%w: %v", errUndecodable, err))
	}
	return applyEffect(ctx, tx, m)
}

// TestHostileMessages feeds every row of the table through the real
// pipeline (memory broker, SQLite, tracing and logging middleware) at
// batch sizes 1 and 8: valid-but-odd ids are applied once and stored
// verbatim; every hostile message is dead-lettered with its reason;
// nothing is lost; the dedup and effects tables survive; memory after the
// run stays within a bound.
func TestHostileMessages(t *testing.T) {
	for _, batch := range []int{1, 8} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			e := newEnv(t)
			rows := hostileRows()
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)

			for _, r := range rows {
				if err := core.NewPublisher(e.broker).Publish(context.Background(), e.queue, r.msg); err != nil {
					t.Fatalf("%s: publish: %v", r.name, err)
				}
			}
			// A fingerprint mismatch: the same id, first with one body,
			// then another.
			core.NewPublisher(e.broker).Publish(context.Background(), e.queue, &core.Message{ID: "fp", Body: []byte(`{"amount":1}`)})

			rec := tracetest.NewSpanRecorder()
			tr, err := tracing.New(tracing.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))),
				tracing.WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
				tracing.WithParentFromMessage())
			if err != nil {
				t.Fatal(err)
			}
			var logs syncBuf
			logger := slog.New(slog.NewJSONHandler(&logs, nil))
			logObs, err := logging.New(logger)
			if err != nil {
				t.Fatal(err)
			}
			opts := []core.Option{core.WithBatchSize(batch), core.WithObserver(tr, logObs),
				core.WithLimits(core.Limits{BodyBytes: 64 << 10, Headers: 1000})}
			res := e.runUntilIdle(time.Minute, decodeEffect, opts...)
			core.NewPublisher(e.broker).Publish(context.Background(), e.queue, &core.Message{ID: "fp", Body: []byte(`{"amount":1000}`)})
			res2 := e.runUntilIdle(time.Minute, decodeEffect, opts...)

			var applied []string
			wantDead := map[string]hostileRow{}
			for _, r := range rows {
				if r.applied {
					applied = append(applied, r.msg.ID)
				} else {
					wantDead[r.name] = r
				}
			}
			e.assertExactlyOnce(append(applied, "fp"))
			// Every hostile row is parked once, with its reason.
			dead := e.broker.DeadLetters(e.queue)
			byID := map[string][]error{}
			for _, d := range dead {
				byID[d.Message.ID] = append(byID[d.Message.ID], d.Cause)
				if d.Cause == nil {
					t.Errorf("dead letter %q without a cause", shortened(d.Message.ID))
				} else if len(d.Cause.Error()) > 1024 {
					t.Errorf("dead letter %q has a cause of %d bytes: hostile ids must not flood it", shortened(d.Message.ID), len(d.Cause.Error()))
				}
			}
			for _, r := range wantDead {
				causes := byID[r.msg.ID]
				if len(causes) != 1 {
					t.Errorf("%s: dead-lettered %d times, want once", r.name, len(causes))
					continue
				}
				if !errors.Is(causes[0], r.cause) || !strings.Contains(causes[0].Error(), r.text) {
					t.Errorf("%s: cause %q; want %v saying %q", r.name, causes[0], r.cause, r.text)
				}
			}
			fpCauses := byID["fp"]
			if len(fpCauses) != 1 || !errors.Is(fpCauses[0], core.ErrFingerprintMismatch) {
				t.Errorf("fingerprint mismatch: causes %v; want one ErrFingerprintMismatch", fpCauses)
			}
			if len(dead) != len(wantDead)+1 {
				t.Errorf("%d dead letters, want %d", len(dead), len(wantDead)+1)
			}
			// Nothing lost: every message ended in a decision.
			total := res.Processed + res.Duplicates + res.DeadLettered + res2.Processed + res2.Duplicates + res2.DeadLettered
			if want := int64(len(rows) + 2); total != want {
				t.Errorf("%d decisions (%+v, %+v), want %d", total, res, res2, want)
			}
			// The hostile SQL did nothing but get stored: both tables are
			// intact and the dedup table holds the ids verbatim.
			var claims int
			if err := e.store.DB().QueryRow(`SELECT count(*) FROM processed_messages WHERE message_id = ?`, `x'); DROP TABLE effects; --`).Scan(&claims); err != nil || claims != 1 {
				t.Errorf("dedup row of the SQL id: %d, %v", claims, err)
			}
			// Malformed trace context gives a fresh root span, not a crash.
			spans := 0
			for _, s := range rec.Ended() {
				if strings.HasPrefix(s.Name(), "process") {
					spans++
				}
			}
			if spans != int(total) {
				t.Errorf("%d process spans for %d decisions", spans, total)
			}
			// Logs clip hostile ids and never break a line.
			for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				if len(line) > 4096 {
					t.Errorf("log line of %d bytes: %.200s…", len(line), line)
				}
				if !json.Valid([]byte(line)) {
					t.Errorf("log line is not one JSON record: %.200q", line)
				}
			}

			// Memory: the table (1.3 MiB of messages) was built before the
			// first reading; what the run leaves reachable is the broker's
			// dead-letter copies and the trace recorder, well under 16 MiB.
			runtime.GC()
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			t.Logf("batch %d: %d dead letters, %d applied; heap grew %d KiB after the run (dead letters held by the broker included)",
				batch, len(dead), len(applied)+1, grew/1024)
			if grew > 16<<20 {
				t.Errorf("heap grew by %d MiB", grew>>20)
			}
		})
	}
}

func shortened(id string) string {
	if len(id) > 40 {
		return fmt.Sprintf("%.40s…(%d bytes)", id, len(id))
	}
	return id
}

// syncBuf is a log sink written from the pipeline's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
