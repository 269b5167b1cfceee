package browsertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemq/idemq/admin/console"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"

	_ "github.com/idemq/idemq/brokers/memory"
)

// serve serves h under /idemq/ as it is, plus the handlers of extra, on a
// server that closes each connection after its answer: every request of the
// browser comes on a new connection, as it does once an idle connection has
// closed, or through a proxy. It returns the console's URL.
func serve(t *testing.T, h http.Handler, extra map[string]http.Handler) string {
	mux := http.NewServeMux()
	mux.Handle("/idemq/", http.StripPrefix("/idemq", h))
	for p, x := range extra {
		mux.Handle(p, x)
	}
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.SetKeepAlivesEnabled(false)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL + "/idemq/"
}

// claimAs has a consumer named consumer apply the messages ids from a
// memory broker into e's store: claims of a consumer the console does not
// show.
func (e *env) claimAs(ctx context.Context, t *testing.T, consumer string, ids ...string) {
	t.Helper()
	u := "mem://" + consumer + "?broker=" + consumer + "-" + randomHex(4)
	pub, err := core.OpenPublisher(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if err := pub.Publish(ctx, "", &core.Message{ID: id, Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	pub.Close()
	st, err := core.OpenStore[*sql.Tx](ctx, e.storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	src, err := core.OpenSource(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := core.New(src, st, func(context.Context, *sql.Tx, *core.Message) error { return nil },
		core.WithName(consumer), core.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- cons.Run(runCtx) }()
	servicetest.WaitFor(t, 30*time.Second, consumer+"'s messages applied", func() bool { return cons.Stats().Processed == int64(len(ids)) })
	stop()
	if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("consumer %s: %v", consumer, err)
	}
}

// overTime returns the text of consumer's row in the overview's table of
// claims over time, and whether that row draws a line.
func (b *browser) overTime(consumer string) (string, bool) {
	b.t.Helper()
	row := eval[[]string](b, fmt.Sprintf(`(() => {
	const r = [...document.querySelectorAll("table.overtime tbody tr")].find(r => r.cells[0].innerText.trim() === %q);
	return r ? [r.innerText, String(r.querySelector("svg polyline") !== null)] : ["", "false"];
})()`, consumer))
	return row[0], row[1] == "true"
}

// The console as idemq console serves it on loopback without a password,
// apart from the service: no user is known, the browser opens a new
// connection for each request, and no Consumer.Stats is given. Its
// actions work; its overview's figures agree with each other, and it
// draws the claims per minute from the store; causes that differ only in
// identifiers fall in one group; pages of other origins can neither read
// it nor act through it.
func TestConsoleWithoutPassword(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ids := []string{"ord-alpha", "ord-beta", "pay-7", "pay-8", "ok-1", "ok-2"}
	failed := map[string]string{
		"ord-alpha": "order ord-alpha: stock reservation failed",
		"ord-beta":  "order ord-beta: stock reservation failed",
		"pay-7":     "stripe: charge ch_3PqRsTuVwXyZ12 failed: card_declined",
		"pay-8":     "stripe: charge ch_9AbCdEfGhIjK34 failed: card_declined",
	}
	e := setupWith(ctx, t, ids, failed)
	// Claims of another consumer in the same table, which this console
	// does not show.
	e.claimAs(ctx, t, "refunds", "r-1", "r-2", "r-3")
	logs := &logBuffer{}
	h, err := console.New(console.Config{Store: e.store,
		Logger:    slog.New(slog.NewTextHandler(logs, nil)),
		Consumers: []console.Consumer{{Name: "payments", DeadLetters: e.dlq, SourceURL: e.src}}})
	if err != nil {
		t.Fatal(err)
	}
	base := serve(t, h, nil)
	b := startBrowser(ctx, t, nil)

	t.Run("overview", func(t *testing.T) {
		b.t = t
		page := b.open(base, "5 claims in the table", "2 by the consumer shown below", "3 by 1 consumer not shown here: refunds (3)")
		if strings.Contains(page, "Per consumer (below): 5 claims") {
			t.Errorf("the overview gives the table's claims as the consumers' below:\n%s", page)
		}
		if rows := b.rows(); len(rows) == 0 || rows[0][0] != "payments" || rows[0][1] != "2" {
			t.Errorf("the consumers' table: %q, want payments with 2 claims", rows)
		}
		row, line := b.overTime("payments")
		if !strings.Contains(row, "2 claims in the last hour") || !line {
			t.Errorf("payments over time: %q (a line: %v), want its 2 claims per minute from the store", row, line)
		}
		b.screenshot("standalone")
	})

	t.Run("cause groups", func(t *testing.T) {
		b.t = t
		b.open(base+"dlq?consumer=payments", "4 of 4 dead letters", "2 cause groups",
			"2 idemq: message …: handler: permanent: order …: stock reservation failed",
			"2 idemq: message …: handler: permanent: stripe: charge … failed: card_declined")
	})

	t.Run("purge a group", func(t *testing.T) {
		b.t = t
		b.open(base + "dlq?consumer=payments")
		b.click(`//section[h2[contains(., "stock reservation")]]//a[normalize-space(.)="purge group"]`,
			"Purge 2 dead letters of payments", "ord-alpha", "ord-beta")
		b.click(buttonText("Purge"), "purged 2 dead letters")
		if n := e.deadLetters(ctx, t); n != 2 {
			t.Fatalf("%d dead letters after the purge, want 2", n)
		}
	})

	t.Run("redrive a group", func(t *testing.T) {
		b.t = t
		b.open(base + "dlq?consumer=payments")
		b.click(`//section[h2[contains(., "stripe")]]//a[normalize-space(.)="redrive group"]`,
			"Redrive 2 dead letters of payments", "pay-7", "pay-8")
		b.click(buttonText("Redrive"), "redrove 2 dead letters")
		e.consume(ctx, t, func(*core.Message) error { return nil }, func() bool {
			l := e.ledger(ctx, t)
			return l["pay-7"] > 0 && l["pay-8"] > 0
		})
		want := map[string]int{"ok-1": 1, "ok-2": 1, "pay-7": 1, "pay-8": 1}
		if got := e.ledger(ctx, t); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("ledger rows by id %v, want %v", got, want)
		}
		b.open(base+"dlq?consumer=payments", "0 of 0 dead letters")
	})

	t.Run("forget a claim", func(t *testing.T) {
		b.t = t
		b.open(base + "lookup?consumer=payments&ids=ok-1")
		b.click(`//tr[td[1][normalize-space(.)="ok-1"]]//a[normalize-space(.)="forget…"]`, "Type the id to confirm")
		b.do(chromedp.SendKeys(`//input[@name="confirm"]`, "ok-1"))
		b.click(buttonText("Forget"), "forgot 1 claims of consumer payments for id ok-1")
		if e.claimed(ctx, t, "ok-1") {
			t.Errorf("ok-1 is still claimed")
		}
	})

	// Without a password anyone who reaches the console may act: on
	// loopback, the machine's users. A page of another origin in the
	// operator's browser may not: it cannot read a page, so it has no
	// token, and even with a valid token its post is refused.
	t.Run("other origins", func(t *testing.T) {
		b.t = t
		evil := newEvilSite(t, base)
		b.open(evil.srv.URL + "/blank")
		got := eval[string](b, fmt.Sprintf(`fetch(%q, {credentials: "include"}).then(r => r.text()).then(t => "read " + t.length + " bytes", e => e.name)`,
			base+"forget?consumer=payments&id=ok-2"))
		if got != "TypeError" {
			t.Errorf("a page of another origin fetched the console's form: %s, want a TypeError", got)
		}
		forget := actionFormAs(t, base, "forget?consumer=payments&id=ok-2", nil)
		forget.Set("confirm", "ok-2")
		evil.set("forget", forget)
		for _, o := range evil.origins() {
			evil.submit(t, b, o)
		}
		if !e.claimed(ctx, t, "ok-2") {
			t.Fatalf("a forget posted from another origin forgot ok-2")
		}
	})
	if l := logs.String(); strings.Count(l, `action="dlq `) != 2 || !strings.Contains(l, "action=forget") {
		t.Errorf("the actions are not logged:\n%s", l)
	}
}

// sessionCookie is the cookie the service's login sets.
const sessionCookie = "ops_session"

// cookieAuth is a service's own authentication: /login takes the
// operator's name and password from a form and sets a session cookie;
// without the cookie the console redirects there. The console is given
// no Config.User, as docs/operating.md mounts it.
type cookieAuth struct {
	mu       sync.Mutex
	sessions map[string]string // session id to user
}

func (a *cookieAuth) login(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, `<!doctype html><title>Sign in</title><form method="post" action="/login">
<input name="user"> <input name="password" type="password"> <button>Sign in</button></form>`)
		return
	}
	if r.PostFormValue("user") != operator || r.PostFormValue("password") != password {
		http.Error(w, "wrong name or password", http.StatusUnauthorized)
		return
	}
	id := randomHex(16)
	a.mu.Lock()
	a.sessions[id] = operator
	a.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
	http.Redirect(w, r, "/idemq/", http.StatusSeeOther)
}

func (a *cookieAuth) require(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := r.Cookie(sessionCookie)
		a.mu.Lock()
		ok := err == nil && a.sessions[c.Value] != ""
		a.mu.Unlock()
		if !ok {
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// The console mounted behind the service's own cookie login, which it
// knows nothing of: its actions work in the browser, and a page of
// another origin, to which the browser sends the session cookie, still
// cannot act through it.
func TestConsoleBehindCookieLogin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := setup(ctx, t)
	h, err := console.New(console.Config{Store: e.store, Outbox: e.outbox,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Consumers: []console.Consumer{{Name: "payments", DeadLetters: e.dlq, SourceURL: e.src}}})
	if err != nil {
		t.Fatal(err)
	}
	auth := &cookieAuth{sessions: map[string]string{}}
	base := serve(t, auth.require(h), map[string]http.Handler{"/login": http.HandlerFunc(auth.login)})
	b := startBrowser(ctx, t, nil)

	b.open(base, "Sign in")
	b.do(chromedp.SendKeys(`//input[@name="user"]`, operator), chromedp.SendKeys(`//input[@name="password"]`, password))
	b.click(buttonText("Sign in"), "Dedup table", "4 in "+e.q)

	b.open(base + "dlq?consumer=payments")
	b.click(`//section[h2[contains(., "card declined")]]//a[normalize-space(.)="redrive group"]`, "Redrive 2 dead letters of payments")
	b.click(buttonText("Redrive"), "redrove 2 dead letters")
	if n := e.deadLetters(ctx, t); n != 2 {
		t.Fatalf("%d dead letters after the redrive, want 2", n)
	}
	b.open(base + "lookup?consumer=payments&ids=pay-1")
	b.click(`//tr[td[1][normalize-space(.)="pay-1"]]//a[normalize-space(.)="forget…"]`, "Type the id to confirm")
	b.do(chromedp.SendKeys(`//input[@name="confirm"]`, "pay-1"))
	b.click(buttonText("Forget"), "forgot 1 claims of consumer payments for id pay-1")
	if e.claimed(ctx, t, "pay-1") {
		t.Errorf("pay-1 is still claimed")
	}

	// The session cookie goes with a post from 127.0.0.1 on another port
	// (the same site): the console refuses it all the same.
	session := func(r *http.Request) {
		auth.mu.Lock()
		defer auth.mu.Unlock()
		for id := range auth.sessions {
			r.AddCookie(&http.Cookie{Name: sessionCookie, Value: id})
		}
	}
	evil := newEvilSite(t, base)
	form := actionFormAs(t, base, "dlq/confirm?consumer=payments&do=purge-all", session)
	evil.set("dlq/act", form)
	evil.submit(t, b, evil.origins()[0])
	if n := e.deadLetters(ctx, t); n != 2 {
		t.Errorf("%d dead letters after a purge posted from another origin, want 2", n)
	}
}
