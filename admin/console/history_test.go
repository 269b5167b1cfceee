package console

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core"

	_ "github.com/idemq/idemq/brokers/memory"
	_ "github.com/idemq/idemq/stores/sqlite"
)

func TestRingKeepsTheNewest(t *testing.T) {
	r := newRing[int](5)
	if r.last() != nil || len(r.values()) != 0 {
		t.Fatalf("an empty ring holds %v", r.values())
	}
	for i := range 3 {
		r.push(i)
	}
	if got := fmt.Sprint(r.values()); got != "[0 1 2]" {
		t.Errorf("after 3 pushes: %s", got)
	}
	for i := 3; i < 1000; i++ {
		r.push(i)
	}
	if got := fmt.Sprint(r.values()); got != "[995 996 997 998 999]" || *r.last() != 999 || len(r.buf) != 5 {
		t.Errorf("after 1000 pushes: %s, last %d, %d slots", got, *r.last(), len(r.buf))
	}
}

// Three hours of samples every 10 seconds keep one hour of minutes, and
// the last hour's sums count only what those minutes added.
func TestHistoryKeepsAnHour(t *testing.T) {
	h := newHistory()
	start := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	var s core.Stats
	s.Processed, s.Duplicates = 1000, 100 // before the console: totals only
	for i := 0; i < 3*360; i++ {
		h.record(start.Add(time.Duration(i)*10*time.Second), s)
		s.Processed += 2 // 12 a minute
		s.Duplicates++   // 6 a minute
	}
	v := h.view(s)
	if v.Minutes != historyMinutes || len(h.minutes.buf) != historyMinutes {
		t.Fatalf("%d minutes kept in %d slots, want %d", v.Minutes, len(h.minutes.buf), historyMinutes)
	}
	// The newest minute (12:59..., 2:59) holds its 6 samples, as do the
	// 59 before it.
	if v.HourProcessed != 60*12 || v.HourDuplicates != 60*6 {
		t.Errorf("last hour: processed %d, duplicates %d; want %d, %d", v.HourProcessed, v.HourDuplicates, 60*12, 60*6)
	}
	if v.Total.Processed != s.Processed || !v.Since.Equal(start) {
		t.Errorf("total %d since %v", v.Total.Processed, v.Since)
	}
	if n := strings.Count(v.Spark.Processed, ","); n != historyMinutes {
		t.Errorf("%d points in the processed line, want %d: %s", n, historyMinutes, v.Spark.Processed)
	}
	if v.Spark.Max != 12 {
		t.Errorf("scale top %d, want 12", v.Spark.Max)
	}
	// A counter going back adds nothing.
	h.record(start.Add(3*time.Hour), core.Stats{})
	if v := h.view(core.Stats{}); v.HourProcessed != 59*12 {
		t.Errorf("after a counter went back: processed %d in the last hour, want %d", v.HourProcessed, 59*12)
	}
}

func TestSampleEveryIsChecked(t *testing.T) {
	s := histStore(t)
	for _, d := range []time.Duration{-time.Second, 2 * time.Minute} {
		_, err := New(Config{Store: s, Consumers: []Consumer{{Name: "a"}}, SampleEvery: d})
		if err == nil || !strings.Contains(err.Error(), "Config.SampleEvery") {
			t.Errorf("SampleEvery %v: %v, want an error naming Config.SampleEvery", d, err)
		}
	}
}

func histStore(t *testing.T) *admin.Store {
	t.Helper()
	s, _ := histStoreURL(t)
	return s
}

func histStoreURL(t *testing.T) (*admin.Store, string) {
	t.Helper()
	raw := "sqlite://" + filepath.Join(t.TempDir(), "claims.db") + "?retention=24h"
	s, err := admin.OpenStore(context.Background(), raw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, raw
}

// getPage fetches the console's overview from srv.
func histOverview(t *testing.T, srv *httptest.Server) (string, http.Header) {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /: %d %v\n%s", resp.StatusCode, err, b)
	}
	return string(b), resp.Header
}

// samplerRunning reports whether a goroutine runs the sampler.
func samplerRunning() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Contains(string(buf), "console.(*handler).startSampler")
}

// A console mounted beside a running Consumer: the overview shows its
// processed messages and duplicates per minute as an inline SVG and its
// totals, the consumer without Stats says where to look instead, and the
// sampler ends with Config.Context.
func TestOverviewOverTime(t *testing.T) {
	ctx := context.Background()
	s, storeURL := histStoreURL(t)
	u := fmt.Sprintf("mem://orders?broker=console-history-%d", time.Now().UnixNano())
	st, err := core.OpenStore[*sql.Tx](ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	src, err := core.OpenSource(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	applied := map[string]int{}
	cons, err := core.New(src, st, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		mu.Lock()
		applied[m.ID]++
		mu.Unlock()
		return nil
	}, core.WithName("orders"))
	if err != nil {
		t.Fatal(err)
	}

	consoleCtx, stopConsole := context.WithCancel(ctx)
	defer stopConsole()
	hh, err := New(Config{Store: s, Consumers: []Consumer{{Name: "orders", Stats: cons.Stats}, {Name: "billing"}},
		SampleEvery: 50 * time.Millisecond, Context: consoleCtx})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(hh)
	defer srv.Close()

	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()
	defer func() { stopRun(); <-done }()

	// Five orders, three of them delivered twice.
	pub, err := core.OpenPublisher(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for _, id := range []string{"o-1", "o-2", "o-3", "o-4", "o-5", "o-1", "o-2", "o-3"} {
		if err := pub.Publish(ctx, "", &core.Message{ID: id, Body: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	histWaitFor(t, "eight decisions", func() bool {
		st := cons.Stats()
		return st.Processed+st.Duplicates == 8
	})
	want := cons.Stats()
	if want.Processed != 5 || want.Duplicates != 3 {
		t.Fatalf("the consumer decided %+v, want 5 processed and 3 duplicates", want)
	}
	// A few samples later the last hour holds them all.
	var page string
	var hdr http.Header
	histWaitFor(t, "the samples", func() bool {
		page, hdr = histOverview(t, srv)
		return strings.Contains(page, "processed 5 · duplicates 3 <span")
	})
	for _, w := range []string{
		"Processed and duplicates over time",
		"processed 5 · duplicates 3 · retried 0 · dead-lettered 0", // since the consumer started
		`<svg class="spark"`, `<polyline class="processed"`, `<polyline class="duplicates"`,
		"sampled every 50ms",
		"over time: set Consumer.Stats when the console runs in the service, or see the Grafana dashboard (docs/dashboards/idemq.json)",
	} {
		if !strings.Contains(page, w) {
			t.Errorf("no %q in the overview:\n%s", w, page)
		}
	}
	// orders' sampled decisions, and billing's claims per minute from the
	// store: it has no Stats.
	if n := strings.Count(page, "<svg"); n != 2 {
		t.Errorf("%d SVGs, want 2 (orders' from its Stats, billing's from the store):\n%s", n, page)
	}
	// The SVG's line is drawn, and nothing needs an inline style under the
	// Content-Security-Policy.
	if !regexp.MustCompile(`points="1\d\d,[\d.]+"`).MatchString(page) {
		t.Errorf("no points in the SVG:\n%s", page)
	}
	csp := hdr.Get("Content-Security-Policy")
	if strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "style-src 'self'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	if strings.Contains(page, "style=") || strings.Contains(page, "ZgotmplZ") {
		t.Errorf("an inline style or a refused value in the overview:\n%s", page)
	}

	// The sampler ends with the console's context.
	h := hh.(*handler)
	if !samplerRunning() {
		t.Fatal("no sampler running")
	}
	stopConsole()
	select {
	case <-h.samplerDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the sampler runs on after Config.Context ended")
	}
	histWaitFor(t, "the sampler's goroutine to end", func() bool { return !samplerRunning() })
	// The overview goes on showing what was sampled, and the totals now.
	page, _ = histOverview(t, srv)
	if !strings.Contains(page, "processed 5 · duplicates 3 · retried 0") {
		t.Errorf("after the sampler ended:\n%s", page)
	}
}

// Without any Consumer.Stats no sampler runs.
func TestNoStatsNoSampler(t *testing.T) {
	hh, err := New(Config{Store: histStore(t), Consumers: []Consumer{{Name: "a"}}})
	if err != nil {
		t.Fatal(err)
	}
	if h := hh.(*handler); h.samplerDone != nil {
		t.Error("a sampler started without Consumer.Stats")
	}
}

func histWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
