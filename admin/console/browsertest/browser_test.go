package browsertest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/admin/console"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/sqliteoutbox"

	_ "github.com/idemq/idemq/brokers/rabbitmq"
	_ "github.com/idemq/idemq/stores/sqlite"
)

// The operator's credentials the auth middleware in front of the console
// lets in.
const (
	operator = "alice"
	password = "s3cret"
)

// screenshotsEnv, set to 1, writes a full-page PNG of each page to
// docs/console.
const screenshotsEnv = "IDEMQ_CONSOLE_SCREENSHOTS"

// chromiumEnv names the Chromium (or Chrome) binary to run.
const chromiumEnv = "IDEMQ_CHROMIUM"

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// chromium returns the path of the browser to run, or ends t naming what to
// install.
func chromium(t *testing.T) string {
	if p := os.Getenv(chromiumEnv); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			servicetest.Unavailable(t, "%s=%s: %v", chromiumEnv, p, err)
		}
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	servicetest.Unavailable(t, "no Chromium on PATH: install chromium or set %s to a Chromium or Chrome binary", chromiumEnv)
	return ""
}

// mount serves h under /idemq/ behind basic auth, as a service would, and
// returns the console's URL.
func mount(t *testing.T, h http.Handler) string {
	mux := http.NewServeMux()
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != operator || p != password {
				w.Header().Set("WWW-Authenticate", `Basic realm="ops"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	mux.Handle("/idemq/", http.StripPrefix("/idemq", auth(h)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/idemq/"
}

// browser is one tab of a headless Chromium that sends the operator's
// credentials with every request.
type browser struct {
	t   *testing.T
	ctx context.Context
}

func newBrowser(ctx context.Context, t *testing.T) *browser {
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(operator+":"+password))
	return startBrowser(ctx, t, network.Headers{"Authorization": auth})
}

// startBrowser starts a headless Chromium whose tab sends headers with
// every request (none when nil).
func startBrowser(ctx context.Context, t *testing.T, headers network.Headers) *browser {
	exe := chromium(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 800),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("force-color-profile", "srgb"),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	err := chromedp.Do(bctx,
		chromedp.EmulateViewport(1200, 800),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			if headers == nil {
				return nil
			}
			_, err := cdp.Call(ctx, tg, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: headers})
			return err
		}))
	if err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	return &browser{t: t, ctx: bctx}
}

// do runs steps in the tab.
func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatal(err)
	}
}

// open navigates to u and wants status 200 and each of want in the page's
// text.
func (b *browser) open(u string, want ...string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(u))
	if err != nil {
		b.t.Fatalf("opening %s: %v", u, err)
	}
	if resp.Status != http.StatusOK {
		b.t.Fatalf("opening %s: status %d\n%s", u, resp.Status, b.text())
	}
	return b.want(want...)
}

// click clicks the element sel finds, waits for the page it loads and wants
// status 200 and each of want in its text.
func (b *browser) click(sel string, want ...string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(sel, chromedp.NodeVisible))
	if err != nil {
		b.t.Fatalf("clicking %s: %v", sel, err)
	}
	if resp.Status != http.StatusOK {
		b.t.Fatalf("clicking %s: status %d\n%s", sel, resp.Status, b.text())
	}
	return b.want(want...)
}

// text returns the page's visible text.
func (b *browser) text() string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		b.t.Fatal(err)
	}
	return s
}

// want wants each of want in the page's text, and returns the text.
func (b *browser) want(want ...string) string {
	b.t.Helper()
	s := b.text()
	for _, w := range want {
		if !strings.Contains(s, w) {
			b.t.Errorf("no %q in the page:\n%s", w, s)
		}
	}
	return s
}

// eval evaluates expr (awaiting a promise) in the page.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// submitFromPage builds a form in the page that posts fields to action
// (relative to the page), submits it, and returns the answer's status.
func (b *browser) submitFromPage(action string, fields url.Values) int64 {
	b.t.Helper()
	script := fmt.Sprintf(`(() => {
	const f = document.createElement("form");
	f.method = "post";
	f.action = %q;
	for (const [k, v] of new URLSearchParams(%q)) {
		const i = document.createElement("input");
		i.type = "hidden"; i.name = k; i.value = v;
		f.appendChild(i);
	}
	document.body.appendChild(f);
	f.submit();
})()`, action, fields.Encode())
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Evaluate[chromedp.Void](script))
	if err != nil {
		b.t.Fatalf("posting to %s from the page: %v", action, err)
	}
	return resp.Status
}

// rows returns the cells' text of each row of the page's tables.
func (b *browser) rows() [][]string {
	return eval[[][]string](b, `[...document.querySelectorAll("tbody tr")].map(r => [...r.cells].map(c => c.innerText.trim()))`)
}

// screenshot writes a full-page PNG of the page to docs/console/name.png
// when IDEMQ_CONSOLE_SCREENSHOTS=1.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	if os.Getenv(screenshotsEnv) != "1" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatal(err)
	}
	path := filepath.Join("..", "..", "..", "docs", "console", name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// Selectors by XPath.
func linkText(text string) string { return fmt.Sprintf(`//a[normalize-space(.)=%q]`, text) }
func buttonText(text string) string {
	return fmt.Sprintf(`//button[normalize-space(.)=%q]`, text)
}

var hiddenInput = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// actionForm fetches a confirmation page of the console at base as the
// operator and returns its hidden fields, token included: what a page of
// another origin would need to forge the action.
func actionForm(t *testing.T, base, path string) url.Values {
	t.Helper()
	return actionFormAs(t, base, path, func(r *http.Request) { r.SetBasicAuth(operator, password) })
}

// actionFormAs is actionForm with the credentials auth sets on the request
// (none when nil).
func actionFormAs(t *testing.T, base, path string, auth func(*http.Request)) url.Values {
	t.Helper()
	req, err := http.NewRequest("GET", base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != nil {
		auth(req)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v\n%s", path, resp.StatusCode, err, page)
	}
	form := url.Values{}
	for _, f := range hiddenInput.FindAllStringSubmatch(string(page), -1) {
		form.Add(html.UnescapeString(f[1]), html.UnescapeString(f[2]))
	}
	if form.Get("token") == "" {
		t.Fatalf("GET %s: no token\n%s", path, page)
	}
	return form
}

// postForm posts form to the console at base as the operator, as a client
// that is not a browser (no Origin, no Sec-Fetch-Site), and returns the
// status.
func postForm(t *testing.T, base, path string, form url.Values) int {
	t.Helper()
	req, err := http.NewRequest("POST", base+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(operator, password)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// evilSite is a site of another origin whose page auto-submits a form to
// the console at base: the action and fields set gives it, even a valid
// token.
type evilSite struct {
	base string
	srv  *httptest.Server

	mu     sync.Mutex
	action string
	form   url.Values
}

func newEvilSite(t *testing.T, base string) *evilSite {
	s := &evilSite{base: base}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if r.URL.Path == "/blank" {
			io.WriteString(w, "<!doctype html><title>nothing here</title>\n")
			return
		}
		fmt.Fprintf(w, "<!doctype html><title>win a prize</title><form method=\"post\" action=\"%s\">\n", html.EscapeString(base+s.action))
		for k, vs := range s.form {
			for _, v := range vs {
				fmt.Fprintf(w, "<input type=\"hidden\" name=\"%s\" value=\"%s\">\n", html.EscapeString(k), html.EscapeString(v))
			}
		}
		io.WriteString(w, "</form><script>document.forms[0].submit()</script>\n")
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// set makes the page post form to action (relative to the console).
func (s *evilSite) set(action string, form url.Values) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.action, s.form = action, form
}

// origins are the site's two origins: 127.0.0.1 on its port is the same
// site as the console but another origin; localhost is another site.
func (s *evilSite) origins() []string {
	_, port, _ := strings.Cut(strings.TrimPrefix(s.srv.URL, "http://"), ":")
	return []string{s.srv.URL, "http://localhost:" + port}
}

// submit opens the site's page at origin in b, waits for the console's
// answer to its form and wants it refused as cross-origin.
func (s *evilSite) submit(t *testing.T, b *browser, origin string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	err := chromedp.Do(ctx,
		chromedp.Navigate(origin+"/"),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`location.href.startsWith(%q) && document.readyState === "complete"`, s.base)))
	if err != nil {
		t.Fatalf("the form of %s: %v", origin, err)
	}
	b.want("cross-origin request refused")
}

// The messages of the test: two applied, four dead-lettered by a failing
// handler under two causes.
var (
	appliedIDs = []string{"pay-1", "pay-2"}
	causes     = map[string]string{
		"pay-3": "card declined: code 51",
		"pay-4": "card declined: code 05",
		"pay-5": "ledger timeout after 30s",
		"pay-6": "ledger timeout after 31s",
	}
	allIDs = []string{"pay-1", "pay-2", "pay-3", "pay-4", "pay-5", "pay-6"}
)

// env is the services behind the console: a RabbitMQ queue with its dead
// letters, an SQLite dedup store whose database also holds the handler's
// ledger, an SQLite outbox with parked rows.
type env struct {
	src      string // the consumer's source URL
	q        string
	storeURL string
	store    *admin.Store
	db       *sql.DB // the store's database, for the ledger
	dlq      admin.DeadLetterQueue
	outbox   admin.OutboxTable
}

func setup(ctx context.Context, t *testing.T) *env { return setupWith(ctx, t, allIDs, causes) }

// setupWith is setup with the messages ids, of which a failing handler
// dead-letters those failed names, each with its cause.
func setupWith(ctx context.Context, t *testing.T, ids []string, failed map[string]string) *env {
	amqp := servicetest.RabbitMQURL(t)
	e := &env{q: "idemq-console-" + randomHex(4)}
	servicetest.DeleteQueuesAtCleanup(t, amqp, e.q)
	e.src = amqp + "?queue=" + e.q
	dir := t.TempDir()
	path := filepath.Join(dir, "claims.db")
	e.storeURL = "sqlite://" + path + "?retention=24h"
	var err error
	if e.store, err = admin.OpenStore(ctx, e.storeURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.store.Close() })
	if err := e.store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if e.db, err = sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.db.Close() })
	if _, err := e.db.ExecContext(ctx, `CREATE TABLE ledger (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	// Opening the source declares the queue, and its dead-letter queue.
	declare, err := core.OpenSource(ctx, e.src)
	if err != nil {
		t.Fatal(err)
	}
	declare.Close()
	pub, err := core.OpenPublisher(ctx, e.src)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		m := &core.Message{ID: id, Body: fmt.Appendf(nil, `{"card":"4111-1111-1111-1111","amount":%d}`, (i+1)*100),
			Headers: map[string]string{"app-version": "2.0.1"}}
		if err := pub.Publish(ctx, "", m); err != nil {
			t.Fatal(err)
		}
	}
	pub.Close()
	// A handler that fails the four for good: a real consumer
	// dead-letters them.
	e.consume(ctx, t, func(m *core.Message) error {
		if c, ok := failed[m.ID]; ok {
			return core.Permanent(errors.New(c))
		}
		return nil
	}, func() bool {
		return e.deadLetters(ctx, t) == len(failed) && len(e.ledger(ctx, t)) == len(ids)-len(failed)
	})

	if e.dlq, err = admin.OpenDeadLetters(ctx, e.src); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.dlq.Close() })
	e.outbox = parkedOutbox(ctx, t, filepath.Join(dir, "app.db"))
	return e
}

// consume runs a consumer named payments on the queue until done, its
// handler recording each message it applies in the ledger unless fail
// returns an error.
func (e *env) consume(ctx context.Context, t *testing.T, fail func(*core.Message) error, done func() bool) {
	t.Helper()
	st, err := core.OpenStore[*sql.Tx](ctx, e.storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	source, err := core.OpenSource(ctx, e.src)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := core.New(source, st, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if err := fail(m); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO ledger (id) VALUES (?)`, m.ID)
		return err
	}, core.WithName("payments"), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- cons.Run(runCtx) }()
	servicetest.WaitFor(t, 30*time.Second, "the consumer's messages", done)
	stop()
	if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("consumer: %v", err)
	}
}

// ledger counts the ledger's rows by message id.
func (e *env) ledger(ctx context.Context, t *testing.T) map[string]int {
	t.Helper()
	rows, err := e.db.QueryContext(ctx, `SELECT id, COUNT(*) FROM ledger GROUP BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// deadLetters counts the queue's dead letters.
func (e *env) deadLetters(ctx context.Context, t *testing.T) int {
	t.Helper()
	dlq := e.dlq
	if dlq == nil {
		var err error
		if dlq, err = admin.OpenDeadLetters(ctx, e.src); err != nil {
			t.Fatal(err)
		}
		defer dlq.Close()
	}
	n := 0
	if err := dlq.Scan(ctx, func(*admin.Parked) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// claimed reports whether consumer payments holds a claim on id.
func (e *env) claimed(ctx context.Context, t *testing.T, id string) bool {
	t.Helper()
	infos, err := e.store.Lookup(ctx, "payments", []string{id})
	if err != nil {
		t.Fatal(err)
	}
	return infos[0].Claimed
}

// parkedOutbox makes an SQLite outbox at path with one row parked by a
// relay whose publisher refuses it, and one pending row held behind it.
func parkedOutbox(ctx context.Context, t *testing.T, path string) admin.OutboxTable {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	o, err := sqliteoutbox.New(sqliteoutbox.WithTable("events_outbox"))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Write(ctx, tx,
		&outbox.Message{ID: "evt-1", Key: "order-7", Destination: "orders", Body: []byte("poison")},
		&outbox.Message{ID: "evt-2", Key: "order-7", Destination: "orders", Body: []byte("fine")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	pub := outbox.PublisherFunc(func(_ context.Context, dest string, msgs ...*driver.Message) error {
		for _, m := range msgs {
			if string(m.Body) == "poison" {
				return fmt.Errorf("%s: message too large", dest)
			}
		}
		return nil
	})
	relay, err := outbox.NewRelay(o.Store(db), pub, outbox.WithMaxAttempts(1), outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	relay.RunOnce(ctx)
	table, err := admin.OpenOutbox(ctx, "sqlite://"+path+"?table=events_outbox", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { table.Close() })
	return table
}

// logBuffer is a console's log.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The console in a real browser over RabbitMQ, SQLite and an outbox: every
// page, a group redriven through its confirmation and applied once, a claim
// forgotten through the typed id, and the refusals a browser meets: a
// read-only console, and forms posted from pages of other origins.
func TestConsoleInBrowser(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := setup(ctx, t)
	b := newBrowser(ctx, t)
	logs := &logBuffer{}
	h, err := console.New(console.Config{Store: e.store, Outbox: e.outbox,
		Logger:    slog.New(slog.NewTextHandler(logs, nil)),
		Consumers: []console.Consumer{{Name: "payments", DeadLetters: e.dlq, SourceURL: e.src}}})
	if err != nil {
		t.Fatal(err)
	}
	base := mount(t, h)

	t.Run("pages", func(t *testing.T) {
		b.t = t
		// The horizon is checked in the background: reload until it is
		// shown.
		b.open(base)
		servicetest.WaitFor(t, 30*time.Second, "the redelivery horizon on the overview", func() bool {
			b.open(base)
			return strings.Contains(b.text(), "redelivery")
		})
		page := b.want("Dedup table", "2 claims", "payments", "4 in "+e.q, "Outbox events_outbox")
		if strings.Contains(page, "guest:guest") {
			t.Errorf("the overview shows credentials:\n%s", page)
		}
		b.screenshot("overview")

		b.click(`//nav/a[normalize-space(.)="payments"]`, "4 of 4 dead letters", "2 cause groups",
			"card declined: code …", "ledger timeout after …", "pay-3", "pay-6")
		b.screenshot("deadletters")

		// One group: the list filtered by cause.
		b.do(chromedp.SendKeys(`//input[@name="cause"]`, "card declined"))
		b.click(buttonText("Filter"), "2 of 4 dead letters", "1 cause groups", "pay-3", "pay-4")
		if page := b.text(); strings.Contains(page, "pay-5") {
			t.Errorf("the card group lists pay-5:\n%s", page)
		}
		b.screenshot("group")

		// A message's detail: its body hidden until asked for.
		page = b.click(linkText("pay-3"), "card declined: code 51", "app-version", "2.0.1", "Show body")
		if strings.Contains(page, "4111") {
			t.Errorf("the detail shows the body before it is asked for:\n%s", page)
		}
		b.click(linkText("Show body"), `"amount":300`, "4111-1111-1111-1111")
		b.screenshot("message")
		if l := logs.String(); !strings.Contains(l, "body shown") || !strings.Contains(l, "user="+operator) {
			t.Errorf("the body view is not logged with its user:\n%s", l)
		}

		b.click(linkText("Lookup"))
		b.do(chromedp.SetValue(`//input[@name="consumer"]`, "payments"),
			chromedp.SetValue(`//textarea[@name="ids"]`, "pay-1\npay-3"))
		b.click(buttonText("Look up"), "A lookup of these ids")
		rows := b.rows()
		if len(rows) != 2 || rows[0][0] != "pay-1" || rows[0][1] != "yes" || rows[1][0] != "pay-3" || rows[1][1] != "no" {
			t.Errorf("lookup rows %q, want pay-1 applied, pay-3 not", rows)
		}
		b.screenshot("lookup")

		b.click(`//nav/a[normalize-space(.)="Outbox"]`, "1 pending rows", "1 parked", "evt-1", "order-7", "orders: message too large")
		b.screenshot("outbox")
	})

	t.Run("redrive a group", func(t *testing.T) {
		b.t = t
		b.open(base + "dlq?consumer=payments")
		b.click(`//section[h2[contains(., "card declined")]]//a[normalize-space(.)="redrive group"]`,
			"Redrive 2 dead letters of payments", `(cause group “idemq: message …: handler: permanent: card declined: code …”)`, "pay-3", "pay-4")
		b.screenshot("redrive")
		b.click(buttonText("Redrive"), "redrove 2 dead letters")
		b.screenshot("redrive-done")
		if n := e.deadLetters(ctx, t); n != 2 {
			t.Fatalf("%d dead letters after the redrive, want 2", n)
		}
		// A working handler applies each redriven message once.
		e.consume(ctx, t, func(*core.Message) error { return nil }, func() bool {
			l := e.ledger(ctx, t)
			return l["pay-3"] > 0 && l["pay-4"] > 0
		})
		want := map[string]int{"pay-1": 1, "pay-2": 1, "pay-3": 1, "pay-4": 1}
		if got := e.ledger(ctx, t); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("ledger rows by id %v, want %v", got, want)
		}
		b.open(base+"dlq?consumer=payments", "2 of 2 dead letters", "ledger timeout")
	})

	t.Run("forget a claim", func(t *testing.T) {
		b.t = t
		b.open(base + "lookup?consumer=payments&ids=" + url.QueryEscape("pay-1\npay-2"))
		b.click(`//tr[td[1][normalize-space(.)="pay-1"]]//a[normalize-space(.)="forget…"]`,
			"Forget the claim of consumer payments for message pay-1?", "Type the id to confirm")
		b.do(chromedp.SendKeys(`//input[@name="confirm"]`, "pay-1"))
		b.screenshot("forget")
		b.click(buttonText("Forget"), "forgot 1 claims of consumer payments for id pay-1")
		if e.claimed(ctx, t, "pay-1") {
			t.Errorf("pay-1 is still claimed")
		}
		if !e.claimed(ctx, t, "pay-2") {
			t.Errorf("pay-2 lost its claim")
		}
	})

	// A page of another origin auto-submits a form to the console, with
	// the operator's credentials and even a valid token: refused, and
	// nothing changes. 127.0.0.1 on another port is the same site but
	// another origin; localhost is another site.
	t.Run("cross-origin forms", func(t *testing.T) {
		b.t = t
		evil := newEvilSite(t, base)
		evil.set("dlq/act", actionForm(t, base, "dlq/confirm?consumer=payments&do=redrive-all"))
		for _, o := range evil.origins() {
			evil.submit(t, b, o)
			if n := e.deadLetters(ctx, t); n != 2 {
				t.Errorf("%d dead letters after a redrive posted from %s, want 2", n, o)
			}
		}
		if page := b.text(); strings.Contains(page, "redrove") {
			t.Errorf("a cross-origin redrive answered:\n%s", page)
		}

		forget := actionForm(t, base, "forget?consumer=payments&id=pay-2")
		forget.Set("confirm", "pay-2")
		evil.set("forget", forget)
		for _, o := range evil.origins() {
			evil.submit(t, b, o)
			if !e.claimed(ctx, t, "pay-2") {
				t.Fatalf("a forget posted from %s forgot pay-2", o)
			}
		}
		if l := logs.String(); strings.Count(l, "cross-origin") < 4 {
			t.Errorf("the cross-origin posts are not all logged:\n%s", l)
		}
		// The same form from a client that is no browser, so sends no
		// origin: the token and fields were good.
		if code := postForm(t, base, "forget", forget); code != http.StatusOK {
			t.Errorf("the forget form posted directly: %d, want 200", code)
		}
		if e.claimed(ctx, t, "pay-2") {
			t.Errorf("pay-2 is still claimed after the direct forget")
		}
	})

	t.Run("read-only", func(t *testing.T) {
		b.t = t
		dlq, err := admin.OpenDeadLetters(ctx, e.src)
		if err != nil {
			t.Fatal(err)
		}
		defer dlq.Close()
		h, err := console.New(console.Config{Store: e.store, Outbox: e.outbox, ReadOnly: true,
			Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
			Consumers: []console.Consumer{{Name: "payments", DeadLetters: dlq}}})
		if err != nil {
			t.Fatal(err)
		}
		roBase := mount(t, h)
		noActions := func(page string) {
			t.Helper()
			n := eval[int](b, `document.querySelectorAll("form[method=post], button[name=do], input[type=checkbox]").length`)
			if n != 0 {
				t.Errorf("%s: %d action forms, buttons or checkboxes on a read-only console", page, n)
			}
			text := b.text()
			for _, w := range []string{"Redrive", "redrive group", "Purge", "purge group", "forget…"} {
				if strings.Contains(text, w) {
					t.Errorf("%s: %q on a read-only console:\n%s", page, w, text)
				}
			}
		}
		b.open(roBase+"dlq?consumer=payments", "read-only", "2 of 2 dead letters", "ledger timeout")
		noActions("dead letters")
		b.screenshot("read-only")
		b.open(roBase + "lookup?consumer=payments&ids=pay-3")
		if rows := b.rows(); len(rows) != 1 || rows[0][1] != "yes" {
			t.Errorf("lookup rows %q, want pay-3 applied", rows)
		}
		noActions("lookup")
		b.open(roBase+"outbox", "evt-1")
		noActions("outbox")

		// Posts from the page itself, with a token from the writable
		// console: refused. The console's Content-Security-Policy
		// forbids fetch (connect-src falls back to 'none'), so the page's
		// script builds a form and submits it.
		redrive := actionForm(t, base, "dlq/confirm?consumer=payments&do=redrive-all")
		forget := actionForm(t, base, "forget?consumer=payments&id=pay-3")
		forget.Set("confirm", "pay-3")
		for _, p := range []struct {
			path string
			form url.Values
		}{{"dlq/act", redrive}, {"forget", forget}} {
			b.open(roBase + "dlq?consumer=payments")
			if code := b.submitFromPage(p.path, p.form); code != http.StatusForbidden {
				t.Errorf("POST %s from the read-only console's page: %d, want 403", p.path, code)
			}
		}
		if got := eval[string](b, `fetch("dlq/act", {method: "POST"}).then(r => "fetched", e => e.name)`); got != "TypeError" {
			t.Errorf("fetch from the console's page: %s, want a TypeError (the page's policy forbids connections)", got)
		}
		if n := e.deadLetters(ctx, t); n != 2 {
			t.Errorf("%d dead letters after read-only posts, want 2", n)
		}
		if !e.claimed(ctx, t, "pay-3") {
			t.Errorf("pay-3 was forgotten through a read-only console")
		}
	})
}
