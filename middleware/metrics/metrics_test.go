package metrics_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/drain"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/metrics"
	"github.com/idemq/idemq/stores/sqlite"
)

func TestMetricsCountDecisionsExactly(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	m, err := metrics.New(metrics.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	b, err := memory.NewBroker()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var msgs []*core.Message
	for i := range 30 {
		id := string(rune('a' + i%20)) // 20 unique ids, 10 duplicates
		body := []byte("ok")
		if id == "c" {
			body = []byte("poison")
		}
		msgs = append(msgs, &core.Message{ID: id, Body: body})
	}
	msgs = append(msgs, &core.Message{Body: []byte("no id")})
	if err := core.NewPublisher(b).Publish(ctx, "q", msgs...); err != nil {
		t.Fatal(err)
	}
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	failedOnce := false
	h := func(ctx context.Context, tx *sql.Tx, msg *core.Message) error {
		switch {
		case string(msg.Body) == "poison":
			return core.Permanent(errors.New("poison"))
		case msg.ID == "e" && !failedOnce:
			failedOnce = true
			return errors.New("transient")
		}
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = drain.Drain(dctx, b, "q", func(sub *memory.Subscription) (*core.Consumer[*sql.Tx], error) {
		return core.New[*sql.Tx](sub, store, h, append([]core.Option{core.WithObserver(m)}, core.WithName("billing"), core.WithBatchSize(8),
			core.WithBackoff(core.ConstantBackoff(time.Millisecond)), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))...)
	})
	if err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]int64{} // instrument → decision → count
	var inFlight int64 = -1
	var batches uint64
	stages := map[string]uint64{} // stage → count
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch data := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					if mt.Name == metrics.InFlightName {
						inFlight = dp.Value
						continue
					}
					d, _ := dp.Attributes.Value("idemq.decision")
					if got[mt.Name] == nil {
						got[mt.Name] = map[string]int64{}
					}
					got[mt.Name][d.AsString()] += dp.Value
					checkAttrs(t, mt.Name, dp.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					if mt.Name == metrics.StageDurationName {
						st, _ := dp.Attributes.Value(metrics.StageKey)
						stages[st.AsString()] += dp.Count
						for k, want := range map[attribute.Key]string{"messaging.system": "memory",
							"messaging.destination.name": "q", "messaging.consumer.group.name": "billing"} {
							if v, _ := dp.Attributes.Value(k); v.AsString() != want {
								t.Errorf("%s{%s}: %s = %q, want %q", mt.Name, st.AsString(), k, v.AsString(), want)
							}
						}
						if dp.Sum <= 0 {
							t.Errorf("%s{%s}: %d recorded, summing to %v", mt.Name, st.AsString(), dp.Count, dp.Sum)
						}
						continue
					}
					d, _ := dp.Attributes.Value("idemq.decision")
					if got[mt.Name] == nil {
						got[mt.Name] = map[string]int64{}
					}
					got[mt.Name][d.AsString()] += int64(dp.Count)
					checkAttrs(t, mt.Name, dp.Attributes)
				}
			case metricdata.Histogram[int64]:
				for _, dp := range data.DataPoints {
					batches += dp.Count
				}
			}
		}
	}
	// "c" is poison twice: a dead letter releases its claim, so its second
	// copy runs (and dead-letters) again instead of counting as a duplicate.
	want := map[string]int64{"processed": 19, "duplicate": 9, "retry": 1, "dead_letter": 3}
	for _, name := range []string{"messaging.process.duration", "messaging.client.consumed.messages"} {
		for d, n := range want {
			if got[name][d] != n {
				t.Errorf("%s{decision=%s} = %d, want %d (all: %v)", name, d, got[name][d], n, got[name])
			}
		}
	}
	if inFlight != 0 {
		t.Errorf("in-flight gauge ends at %d, want 0", inFlight)
	}
	if batches == 0 {
		t.Error("no batch sizes recorded")
	}
	// Every transaction begins, claims and commits (or rolls back): each
	// claim is timed once, as its batch size is recorded once.
	if stages["claim"] != batches {
		t.Errorf("claim stage timed %d times, want one per batch (%d); all: %v", stages["claim"], batches, stages)
	}
	for _, st := range []string{"begin", "handlers", "commit"} {
		if stages[st] == 0 {
			t.Errorf("stage %s never timed; all: %v", st, stages)
		}
	}
}

func checkAttrs(t *testing.T, name string, set attribute.Set) {
	t.Helper()
	for k, want := range map[attribute.Key]string{"messaging.system": "memory", "messaging.operation.name": "process",
		"messaging.destination.name": "q", "messaging.consumer.group.name": "billing"} {
		if v, _ := set.Value(k); v.AsString() != want {
			t.Errorf("%s: %s = %q, want %q", name, k, v.AsString(), want)
		}
	}
	if d, _ := set.Value("idemq.decision"); d.AsString() == "retry" || d.AsString() == "dead_letter" {
		if v, ok := set.Value("error.type"); !ok || v.AsString() == "" {
			t.Errorf("%s: %s without error.type", name, d.AsString())
		}
	}
}

func TestNilMeterProviderIsNamed(t *testing.T) {
	if _, err := metrics.New(metrics.WithMeterProvider(nil)); err == nil || !strings.Contains(err.Error(), "WithMeterProvider") {
		t.Errorf("error %v does not name WithMeterProvider", err)
	}
}

// sums collects reader and returns each Sum instrument's total over its
// data points, and how many data points carry otel.metric.overflow.
func sums(t *testing.T, reader sdkmetric.Reader) (map[string]int64, int) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	total, overflow := map[string]int64{}, 0
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if data, ok := mt.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range data.DataPoints {
					total[mt.Name] += dp.Value
					if v, _ := dp.Attributes.Value("otel.metric.overflow"); v.AsBool() {
						overflow++
					}
				}
			}
		}
	}
	return total, overflow
}

// Two observers on one MeterProvider (two consumers of one queue in a
// process) count into the same series: their counts add up.
func TestObserversOnOneProviderAddUp(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	ctx := core.ContextWithConsumerName(context.Background(), "billing")
	msg := &core.Message{ID: "a", Source: "q", System: "memory"}
	for n := range 2 {
		m, err := metrics.New(metrics.WithMeterProvider(mp))
		if err != nil {
			t.Fatal(err)
		}
		for range 3 + n {
			m.EndDecision(m.StartDecision(ctx, msg), msg, core.Outcome{Decision: core.Processed})
		}
		m.StartDecision(ctx, msg) // still in flight
	}
	total, _ := sums(t, reader)
	if total["messaging.client.consumed.messages"] != 7 || total[metrics.InFlightName] != 2 {
		t.Errorf("consumed %d, in flight %d; want 7 and 2 (all: %v)", total["messaging.client.consumed.messages"], total[metrics.InFlightName], total)
	}
}

// Past the bound on cached attribute sets, messages are still counted,
// under the otel.metric.overflow set.
func TestManyDestinationsAreAllCounted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	m, err := metrics.New(metrics.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	ctx := core.ContextWithConsumerName(context.Background(), "billing")
	const n = 5000
	for i := range n {
		msg := &core.Message{ID: "a", Source: "q" + strconv.Itoa(i), System: "memory"}
		m.EndDecision(m.StartDecision(ctx, msg), msg, core.Outcome{Decision: core.Duplicate})
	}
	total, overflow := sums(t, reader)
	if total["messaging.client.consumed.messages"] != n || total[metrics.InFlightName] != 0 || overflow == 0 {
		t.Errorf("consumed %d, in flight %d, %d overflow series; want %d, 0 and some", total["messaging.client.consumed.messages"], total[metrics.InFlightName], overflow, n)
	}
}
