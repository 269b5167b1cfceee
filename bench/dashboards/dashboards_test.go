// Package dashboards_test checks the Grafana dashboard in docs/dashboards
// against what idemq emits: a real Consumer records its metrics through the
// OpenTelemetry Prometheus exporter, and every metric and label the
// dashboard's queries name must be in the scrape. It lives in the bench
// module so the exporter stays out of the library's dependencies.
package dashboards_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/drain"
	"github.com/idemq/idemq/middleware/metrics"
	"github.com/idemq/idemq/stores/sqlite"
)

// dashboardPath is the dashboard under test, from this package's directory.
const dashboardPath = "../../docs/dashboards/idemq.json"

// consumerName is the consumer the workload runs as: the value of the
// messaging_consumer_group_name label.
const consumerName = "billing"

// series maps each scraped series name to the label names it carries.
type series map[string]map[string]bool

func TestDashboardNamesOnlyEmittedMetrics(t *testing.T) {
	scraped := scrape(t)
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range scraped {
			if !yield(n) {
				return
			}
		}
	})
	t.Logf("scraped series: %s", strings.Join(names, " "))

	d := loadDashboard(t)
	if len(d.Panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
	exprs := 0
	for _, p := range d.Panels {
		if strings.TrimSpace(p.Title) == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource uid %q, want ${datasource}", p.Title, p.Datasource.UID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q, query %s: datasource uid %q, want ${datasource}", p.Title, tg.RefID, tg.Datasource.UID)
			}
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q, query %s: empty expr", p.Title, tg.RefID)
				continue
			}
			exprs++
			checkExpr(t, scraped, "panel "+p.Title, tg.Expr)
		}
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		q := v.Query.String()
		m := labelValuesRe.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, q)
			continue
		}
		checkExpr(t, scraped, "variable "+v.Name, m[1]+" by ("+m[2]+")")
	}
	for _, v := range []string{"datasource", "consumer"} {
		if !vars[v] {
			t.Errorf("dashboard has no %s variable", v)
		}
	}
	t.Logf("%d panels, %d queries checked", len(d.Panels), exprs)
}

// TestExprNames checks the extraction of metric and label names from
// PromQL on the shapes the dashboard uses.
func TestExprNames(t *testing.T) {
	for _, c := range []struct {
		expr    string
		metrics []string
		labels  []string
	}{
		{`sum by (idemq_decision) (rate(a_total{messaging_consumer_group_name=~"$consumer"}[$__rate_interval]))`,
			[]string{"a_total"}, []string{"idemq_decision", "messaging_consumer_group_name"}},
		{`histogram_quantile(0.99, sum by (le, x) (rate(h_bucket{c=~"${consumer}", d!="a,b"}[5m])))`,
			[]string{"h_bucket"}, []string{"c", "d", "le", "x"}},
		{`sum(rate(h_sum[1m])) / sum without (q) (rate(h_count[1m])) > bool 0 or on (g) vector(0)`,
			[]string{"h_count", "h_sum"}, []string{"g", "q"}},
		{`clamp_min(sum(increase(c_total{e="x"}[$__range])), 1e-9) offset 5m`,
			[]string{"c_total"}, []string{"e"}},
	} {
		ms, ls := exprNames(c.expr)
		if !slices.Equal(ms, c.metrics) || !slices.Equal(ls, c.labels) {
			t.Errorf("%s: metrics %v labels %v, want %v %v", c.expr, ms, ls, c.metrics, c.labels)
		}
	}
}

// checkExpr fails t when expr names a metric the scrape lacks, or a label
// that none of the expression's metrics carries.
func checkExpr(t *testing.T, scraped series, where, expr string) {
	t.Helper()
	ms, ls := exprNames(expr)
	if len(ms) == 0 {
		t.Errorf("%s: %q names no metric", where, expr)
	}
	have := map[string]bool{}
	for _, m := range ms {
		labels, ok := scraped[m]
		if !ok {
			t.Errorf("%s: metric %s is not emitted (query %q)", where, m, expr)
			continue
		}
		for l := range labels {
			have[l] = true
		}
	}
	for _, l := range ls {
		if !have[l] {
			t.Errorf("%s: label %s is on none of %v (query %q)", where, l, ms, expr)
		}
	}
}

var (
	labelValuesRe = regexp.MustCompile(`^\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)
	stringRe      = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	matchersRe    = regexp.MustCompile(`\{([^}]*)\}`)
	matcherNameRe = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	rangeRe       = regexp.MustCompile(`\[[^\]]*\]`)
	groupingRe    = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	varRe         = regexp.MustCompile(`\$\{[^}]*\}|\$[a-zA-Z_][a-zA-Z0-9_]*`)
	numberRe      = regexp.MustCompile(`\b\d[0-9.eE+-]*[a-zA-Z]*\b`)
	identRe       = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
)

// keywords are PromQL words that are neither metrics nor functions.
var keywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true, "Inf": true, "NaN": true}

// exprNames returns the metric names and the label names expr uses,
// sorted: metrics are the identifiers left once strings, label matchers,
// ranges, groupings, Grafana variables, numbers, keywords and function
// calls are taken out; labels are those of the matchers and groupings.
func exprNames(expr string) (metricNames, labelNames []string) {
	labels := map[string]bool{}
	// Matchers first: their values are strings, which go next.
	s := stringRe.ReplaceAllString(expr, `""`)
	s = matchersRe.ReplaceAllStringFunc(s, func(m string) string {
		for _, sm := range matcherNameRe.FindAllStringSubmatch(m, -1) {
			labels[sm[1]] = true
		}
		return " "
	})
	s = groupingRe.ReplaceAllStringFunc(s, func(m string) string {
		inner := groupingRe.FindStringSubmatch(m)[1]
		for _, l := range strings.Split(inner, ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels[l] = true
			}
		}
		return " "
	})
	s = stringRe.ReplaceAllString(s, " ")
	s = rangeRe.ReplaceAllString(s, " ")
	s = varRe.ReplaceAllString(s, " ")
	s = numberRe.ReplaceAllString(s, " ")
	metricSet := map[string]bool{}
	for _, loc := range identRe.FindAllStringIndex(s, -1) {
		name := s[loc[0]:loc[1]]
		rest := strings.TrimLeft(s[loc[1]:], " \t\n")
		if keywords[name] || strings.HasPrefix(rest, "(") {
			continue // a keyword, or a function or aggregation call
		}
		metricSet[name] = true
	}
	for m := range metricSet {
		metricNames = append(metricNames, m)
	}
	for l := range labels {
		labelNames = append(labelNames, l)
	}
	sort.Strings(metricNames)
	sort.Strings(labelNames)
	return metricNames, labelNames
}

// dashboard is the part of Grafana's dashboard model the test reads.
type dashboard struct {
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string   `json:"name"`
			Type  string   `json:"type"`
			Query varQuery `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int        `json:"id"`
	Title      string     `json:"title"`
	Type       string     `json:"type"`
	Datasource datasource `json:"datasource"`
	Targets    []struct {
		RefID      string     `json:"refId"`
		Expr       string     `json:"expr"`
		Datasource datasource `json:"datasource"`
	} `json:"targets"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// varQuery is a variable's query: a string (a datasource variable's
// plugin type) or an object holding the query.
type varQuery struct{ raw json.RawMessage }

func (q *varQuery) UnmarshalJSON(b []byte) error {
	q.raw = append(json.RawMessage(nil), b...)
	return nil
}

// String returns the query text.
func (q varQuery) String() string {
	var s string
	if json.Unmarshal(q.raw, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	_ = json.Unmarshal(q.raw, &o)
	return o.Query
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s does not parse: %v", dashboardPath, err)
	}
	if d.SchemaVersion < 39 {
		t.Errorf("schemaVersion %d, want a recent one (39 or later)", d.SchemaVersion)
	}
	return d
}

// scrape runs a Consumer whose workload has every decision (processed,
// duplicate, retry, dead_letter) with a metrics.Metrics observer exported
// through the OpenTelemetry Prometheus exporter, and returns the series of
// the exporter's /metrics page.
func scrape(t *testing.T) series {
	t.Helper()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	defer func() { _ = mp.Shutdown(ctx) }()
	m, err := metrics.New(metrics.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}

	b, err := memory.NewBroker()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	msgs := []*core.Message{
		{ID: "a", Body: []byte("ok")},
		{ID: "b", Body: []byte("ok")},
		{ID: "a", Body: []byte("ok")},     // a duplicate
		{ID: "flaky", Body: []byte("ok")}, // fails once: a retry
		{ID: "p", Body: []byte("poison")}, // a dead letter
		{ID: "c", Body: []byte("ok")},
	}
	if err := core.NewPublisher(b).Publish(ctx, "orders", msgs...); err != nil {
		t.Fatal(err)
	}
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "dedup.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var failed atomic.Bool
	h := func(ctx context.Context, tx *sql.Tx, msg *core.Message) error {
		switch {
		case string(msg.Body) == "poison":
			return core.Permanent(errors.New("poison"))
		case msg.ID == "flaky" && failed.CompareAndSwap(false, true):
			return errors.New("transient")
		}
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := drain.Drain(dctx, b, "orders", func(sub *memory.Subscription) (*core.Consumer[*sql.Tx], error) {
		return core.New[*sql.Tx](sub, store, h, core.WithName(consumerName), core.WithObserver(m),
			core.WithBatchSize(4), core.WithBackoff(core.ConstantBackoff(time.Millisecond)),
			core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Processed == 0 || res.Duplicates == 0 || res.Retried == 0 || res.DeadLettered == 0 {
		t.Fatalf("workload lacks a decision: %+v", res.Stats)
	}

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	got, decisions, les := parseExposition(t, resp.Body)
	if !les["0.005"] {
		t.Errorf("messaging_process_duration_seconds_bucket has no le=\"0.005\": its buckets are not in seconds (le: %v)", les)
	}
	for _, d := range []string{"processed", "duplicate", "retry", "dead_letter"} {
		if !decisions[d] {
			t.Errorf("scrape has no series with idemq_decision=%q", d)
		}
	}
	return got
}

var (
	sampleRe   = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s`)
	labelRe    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
	decisionRe = regexp.MustCompile(`idemq_decision="([^"]*)"`)
	leRe       = regexp.MustCompile(`\ble="([^"]*)"`)
)

// parseExposition reads the text exposition format: each sample line's
// series name and label names, the idemq_decision values seen and the le
// values of messaging_process_duration_seconds_bucket.
func parseExposition(t *testing.T, r io.Reader) (got series, decisions, les map[string]bool) {
	t.Helper()
	got = series{}
	decisions = map[string]bool{}
	les = map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := sampleRe.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("unparsed exposition line %q", line)
		}
		if got[m[1]] == nil {
			got[m[1]] = map[string]bool{}
		}
		for _, l := range labelRe.FindAllStringSubmatch(m[2], -1) {
			got[m[1]][l[1]] = true
		}
		if d := decisionRe.FindStringSubmatch(m[2]); d != nil {
			decisions[d[1]] = true
		}
		if le := leRe.FindStringSubmatch(m[2]); le != nil && m[1] == "messaging_process_duration_seconds_bucket" {
			les[le[1]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return got, decisions, les
}
