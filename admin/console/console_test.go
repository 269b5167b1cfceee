package console_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/admin/console"
	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	_ "github.com/idemq/idemq/brokers/rabbitmq"
	_ "github.com/idemq/idemq/stores/postgres"
	_ "github.com/idemq/idemq/stores/sqlite"
)

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// memDLQ is the dead letters of a memory broker's queue as an
// admin.DeadLetterQueue: the memory broker redrives a whole queue only, and
// purges nothing.
type memDLQ struct {
	b     *memory.Broker
	queue string
}

func (q *memDLQ) Name() string { return q.queue + " (memory)" }

func (q *memDLQ) Scan(ctx context.Context, fn func(*admin.Parked) error) error {
	for i, dl := range q.b.DeadLetters(q.queue) {
		m := dl.Message
		p := &admin.Parked{Ref: fmt.Sprint(i), ID: m.ID, Cause: dl.Cause.Error(), Attempt: m.Attempt, Origin: q.queue,
			Destination: q.queue, ParkedAt: dl.At, Headers: m.Headers, Body: m.Body}
		if err := fn(p); err != nil {
			return err
		}
	}
	return nil
}

func (q *memDLQ) Redrive(ctx context.Context, sel func(*admin.Parked) bool, progress func(int)) (int, error) {
	n, all := 0, true
	q.Scan(ctx, func(p *admin.Parked) error {
		if sel(p) {
			n++
		} else {
			all = false
		}
		return nil
	})
	if !all {
		return 0, errors.ErrUnsupported
	}
	return q.b.Redrive(q.queue), nil
}

func (q *memDLQ) Purge(context.Context, func(*admin.Parked) bool) (int, error) {
	return 0, errors.ErrUnsupported
}

func (q *memDLQ) Close() error { return nil }

// logBuffer is the console's log.
type logBuffer struct{ servicetest.Buffer }

func newLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewTextHandler(&b.Buffer, nil)), b
}

// client talks to a console mounted under /idemq/ on a test server.
type client struct {
	t    *testing.T
	base string // ending in /idemq/
	hc   *http.Client
}

// mount serves h under /idemq/ behind basic auth, as a service would.
func mount(t *testing.T, h http.Handler) *client {
	mux := http.NewServeMux()
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "alice" || p != "s3cret" {
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
	return &client{t: t, base: srv.URL + "/idemq/", hc: srv.Client()}
}

// do sends a request to path (relative to the console) and returns the
// status and body.
func (c *client) do(method, path string, form url.Values, hdr map[string]string) (int, string) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	req.SetBasicAuth("alice", "s3cret")
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// get fetches path and wants status 200 and each of want in the page.
func (c *client) get(path string, want ...string) string {
	c.t.Helper()
	code, page := c.do("GET", path, nil, nil)
	if code != http.StatusOK {
		c.t.Fatalf("GET %s: %d\n%s", path, code, page)
	}
	for _, w := range want {
		if !strings.Contains(page, w) {
			c.t.Errorf("GET %s: no %q in\n%s", path, w, page)
		}
	}
	return page
}

var (
	hiddenInput = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
	formAction  = regexp.MustCompile(`<form method="post" action="([^"]+)">`)
)

// confirm fetches a confirmation page and returns it, the action its
// form posts to (relative to the console) and its hidden fields.
func (c *client) confirm(path string, want ...string) (string, string, url.Values) {
	c.t.Helper()
	page := c.get(path, want...)
	m := formAction.FindStringSubmatch(page)
	if m == nil {
		c.t.Fatalf("GET %s: no form to post\n%s", path, page)
	}
	// Relative to the page: ../dlq/act from dlq/confirm, ./forget from
	// forget.
	action := strings.TrimPrefix(strings.TrimPrefix(html.UnescapeString(m[1]), "../"), "./")
	form := url.Values{}
	for _, f := range hiddenInput.FindAllStringSubmatch(page, -1) {
		form.Add(html.UnescapeString(f[1]), html.UnescapeString(f[2]))
	}
	return page, action, form
}

// openSQLite opens a store on a new SQLite file.
func openSQLite(t *testing.T) (*admin.Store, string) {
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

// parkMem parks messages on a memory broker's queue: ids[i] with cause
// causes[i].
func parkMem(t *testing.T, brokerName, queue string, ids, causes []string) *memory.Broker {
	t.Helper()
	ctx := context.Background()
	u := "mem://" + queue + "?broker=" + brokerName
	b, err := memory.Named(brokerName)
	if err != nil {
		t.Fatal(err)
	}
	park(ctx, t, u, u, ids, causes)
	return b
}

// park publishes the messages ids to publisherURL, receives them from
// sourceURL, as a Consumer does, and dead-letters each with its cause.
func park(ctx context.Context, t *testing.T, sourceURL, publisherURL string, ids, causes []string) {
	t.Helper()
	src, err := core.OpenSource(ctx, sourceURL)
	if err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, src, 0)
	defer r.Close()
	p, err := core.OpenPublisher(ctx, publisherURL)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i, id := range ids {
		m := &core.Message{ID: id, Body: fmt.Appendf(nil, `{"card":"4111-1111-1111-1111","amount":%d}`, i+1), Headers: map[string]string{"app-version": "2.0.1"}}
		if err := p.Publish(ctx, "", m); err != nil {
			t.Fatal(err)
		}
	}
	for range ids {
		d, err := r.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		i := indexOf(ids, d.Message().ID)
		if err := d.DeadLetter(ctx, errors.New(causes[i])); err != nil {
			t.Fatal(err)
		}
	}
}

func indexOf(ids []string, id string) int {
	for i, v := range ids {
		if v == id {
			return i
		}
	}
	panic("unknown id " + id)
}

func TestNewNamesTheBadField(t *testing.T) {
	s, _ := openSQLite(t)
	for _, tc := range []struct {
		cfg  console.Config
		want string
	}{
		{console.Config{Consumers: []console.Consumer{{Name: "a"}}}, "Config.Store"},
		{console.Config{Store: s}, "Config.Consumers"},
		{console.Config{Store: s, Consumers: []console.Consumer{{Name: "a"}, {}}}, "Config.Consumers[1].Name"},
		{console.Config{Store: s, Consumers: []console.Consumer{{Name: "a"}, {Name: "a"}}}, "Config.Consumers[1].Name"},
		{console.Config{Store: s, Consumers: []console.Consumer{{Name: "a"}}, StatsEvery: -1}, "Config.StatsEvery"},
	} {
		if _, err := console.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
}

// On the memory broker: the overview's counts, the dead letters grouped by
// cause, the body hidden until asked and then redacted, and the guards of
// actions: tokens, same origin, read-only.
func TestMemoryDeadLetters(t *testing.T) {
	s, _ := openSQLite(t)
	name := "console-" + randomHex(4)
	ids := []string{"order-1", "order-2", "order-3", "order-4"}
	causes := []string{"insufficient funds for account 1001", "insufficient funds for account 2002", "insufficient funds for account 3003", `schema: unknown field "coupon"`}
	b := parkMem(t, name, "payments", ids, causes)
	logger, logs := newLogger()
	var redacted []string
	h, err := console.New(console.Config{
		Store:     s,
		Consumers: []console.Consumer{{Name: "payments", DeadLetters: &memDLQ{b, "payments"}}},
		Logger:    logger,
		RedactBody: func(consumer string, p *admin.Parked) []byte {
			redacted = append(redacted, consumer+"/"+p.ID)
			return regexp.MustCompile(`\d{4}-\d{4}-\d{4}-\d{4}`).ReplaceAll(p.Body, []byte("xxxx"))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := mount(t, h)

	c.get("", "payments", ">4</a> in payments (memory)", "a full count", "0 claims",
		`<p class="estimate">0 claims`, "Now: counted up to 10,000; size: the whole database file", "bounded queries only")
	page := c.get("dlq?consumer=payments", "4 of 4 dead letters", "2 cause groups",
		`<span class="count">3</span> insufficient funds for account …`, `<span class="count">1</span> schema: unknown field …`)
	if strings.Contains(page, "4111") {
		t.Errorf("the list shows a body:\n%s", page)
	}
	c.get("dlq?consumer=payments&cause=SCHEMA", "1 of 4 dead letters", "order-4")
	c.get("dlq?consumer=payments&id=order-2", "1 of 4 dead letters", "order-2")
	c.get("dlq?consumer=payments&older=1h", "0 of 4 dead letters")
	c.get("dlq?consumer=payments&newer=1h", "4 of 4 dead letters")
	if code, _ := c.do("GET", "dlq?consumer=payments&older=soon", nil, nil); code != http.StatusBadRequest {
		t.Errorf("a bad age filter: %d, want 400", code)
	}

	// The body is hidden until asked for, and then passed through
	// RedactBody, and the view is logged.
	page = c.get("dlq/message?consumer=payments&ref=0", "order-1", "insufficient funds for account 1001", "app-version", "2.0.1", "Show body")
	if strings.Contains(page, "4111") || strings.Contains(page, "amount") {
		t.Errorf("the detail shows the body before it is asked for:\n%s", page)
	}
	page = c.get("dlq/message?consumer=payments&ref=0&body=1", "xxxx", "amount")
	if strings.Contains(page, "4111") {
		t.Errorf("the body is not redacted:\n%s", page)
	}
	if len(redacted) != 1 || redacted[0] != "payments/order-1" {
		t.Errorf("RedactBody called for %v, want payments/order-1", redacted)
	}
	if l := logs.String(); !strings.Contains(l, "body shown") || !strings.Contains(l, "user=alice") {
		t.Errorf("the body view is not logged with its user:\n%s", l)
	}

	// A group's redrive: the confirmation counts the group, the POST
	// needs its token.
	_, action, form := c.confirm("dlq/confirm?consumer=payments&do=redrive&group="+url.QueryEscape("insufficient funds for account …"),
		"<strong>3</strong> dead letters")
	if action != "dlq/act" || form.Get("token") == "" || form.Get("group") == "" {
		t.Fatalf("confirmation form: %s %v", action, form)
	}
	// Without a token, with a wrong one, with one for another action, from
	// another site: refused, and nothing changes.
	noToken := url.Values{}
	for k, v := range form {
		if k != "token" {
			noToken[k] = v
		}
	}
	wrong := cloneForm(form)
	wrong.Set("token", "9999999999.AAAA")
	_, _, purgeForm := c.confirm("dlq/confirm?consumer=payments&do=purge-all", "<strong>4</strong> dead letters")
	other := cloneForm(form)
	other.Set("token", purgeForm.Get("token"))
	for what, f := range map[string]url.Values{"no token": noToken, "a wrong token": wrong, "a purge's token": other} {
		if code, page := c.do("POST", "dlq/act", f, nil); code != http.StatusForbidden {
			t.Errorf("POST with %s: %d, want 403\n%s", what, code, page)
		}
	}
	if code, _ := c.do("POST", "dlq/act", form, map[string]string{"Sec-Fetch-Site": "cross-site"}); code != http.StatusForbidden {
		t.Errorf("a cross-site POST: %d, want 403", code)
	}
	if code, _ := c.do("POST", "dlq/act", form, map[string]string{"Origin": "https://evil.example"}); code != http.StatusForbidden {
		t.Errorf("a POST from another origin: %d, want 403", code)
	}
	if code, _ := c.do("GET", "dlq/act", nil, nil); code != http.StatusMethodNotAllowed {
		t.Errorf("GET of an action: %d, want 405", code)
	}
	if n := len(b.DeadLetters("payments")); n != 4 {
		t.Fatalf("%d dead letters after refused actions, want 4", n)
	}
	if l := logs.String(); !strings.Contains(l, "without a valid token") || !strings.Contains(l, "cross-origin") {
		t.Errorf("the refusals are not logged:\n%s", l)
	}
	// Every message shown: the memory broker redrives them all.
	_, _, all := c.confirm("dlq/confirm?consumer=payments&do=redrive-all", "<strong>4</strong> dead letters")
	c.post("dlq/act", all, "redrove 4 dead letters of payments")
	if n := len(b.DeadLetters("payments")); n != 0 {
		t.Errorf("%d dead letters after the redrive, want 0", n)
	}
	if n := b.Len("payments"); n != 4 {
		t.Errorf("%d messages in the queue after the redrive, want 4", n)
	}
	if l := logs.String(); !strings.Contains(l, `action="dlq redrive"`) || !strings.Contains(l, "count=4") || !strings.Contains(l, "user=alice") {
		t.Errorf("the redrive is not logged with who, what and how many:\n%s", l)
	}
}

func cloneForm(f url.Values) url.Values {
	out := url.Values{}
	for k, v := range f {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// post posts form to path and wants status 200 and each of want.
func (c *client) post(path string, form url.Values, want ...string) string {
	c.t.Helper()
	code, page := c.do("POST", path, form, nil)
	if code != http.StatusOK {
		c.t.Fatalf("POST %s: %d\n%s", path, code, page)
	}
	for _, w := range want {
		if !strings.Contains(page, w) {
			c.t.Errorf("POST %s: no %q in\n%s", path, w, page)
		}
	}
	return page
}

func TestReadOnly(t *testing.T) {
	s, _ := openSQLite(t)
	name := "console-" + randomHex(4)
	b := parkMem(t, name, "payments", []string{"a-1"}, []string{"boom"})
	h, err := console.New(console.Config{Store: s, ReadOnly: true,
		Consumers: []console.Consumer{{Name: "payments", DeadLetters: &memDLQ{b, "payments"}}}})
	if err != nil {
		t.Fatal(err)
	}
	c := mount(t, h)
	page := c.get("dlq?consumer=payments", "read-only", "1 of 1 dead letters")
	if strings.Contains(page, "Redrive") || strings.Contains(page, "<button name=\"do\"") {
		t.Errorf("a read-only console shows action buttons:\n%s", page)
	}
	for _, path := range []string{"dlq/confirm?consumer=payments&do=redrive-all", "forget?consumer=payments&id=a-1"} {
		if code, _ := c.do("GET", path, nil, nil); code != http.StatusForbidden {
			t.Errorf("GET %s on a read-only console: %d, want 403", path, code)
		}
	}
	for _, path := range []string{"dlq/act", "forget", "outbox/act"} {
		if code, _ := c.do("POST", path, url.Values{"consumer": {"payments"}, "do": {"redrive-all"}, "id": {"a-1"}}, nil); code != http.StatusForbidden {
			t.Errorf("POST %s on a read-only console: %d, want 403", path, code)
		}
	}
	if n := len(b.DeadLetters("payments")); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
}

// On RabbitMQ with an SQLite store: a group of dead letters redriven
// through the console is consumed by a working handler and applied once;
// the rest purged; the lookup shows the claims, and forget removes one.
func TestRabbitMQ(t *testing.T) {
	amqp := servicetest.RabbitMQURL(t)
	q := "idemq-console-" + randomHex(4)
	servicetest.DeleteQueuesAtCleanup(t, amqp, q)
	src := amqp + "?queue=" + q
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, storeURL := openSQLite(t)
	ids := []string{"pay-1", "pay-2", "pay-3", "pay-4", "pay-5"}
	causes := []string{"card declined: code 51", "card declined: code 05", "card declined: code 51", "ledger timeout after 30s", "ledger timeout after 31s"}
	park(ctx, t, src, src, ids, causes)
	dlq, err := admin.OpenDeadLetters(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	defer dlq.Close()
	logger, logs := newLogger()
	h, err := console.New(console.Config{Store: s, Logger: logger,
		Consumers: []console.Consumer{{Name: "payments", DeadLetters: dlq, SourceURL: src}}})
	if err != nil {
		t.Fatal(err)
	}
	c := mount(t, h)
	servicetest.WaitFor(t, 30*time.Second, "five dead letters on the overview", func() bool {
		_, page := c.do("GET", "", nil, nil)
		return strings.Contains(page, ">5</a> in "+q)
	})
	if page := c.get(""); strings.Contains(page, "guest:guest") {
		t.Errorf("the overview shows credentials:\n%s", page)
	}
	servicetest.WaitFor(t, 30*time.Second, "the horizon check", func() bool {
		_, page := c.do("GET", "", nil, nil)
		return strings.Contains(page, "redelivery horizon")
	})
	c.get("dlq?consumer=payments", "2 cause groups", `<span class="count">3</span> card declined: code …`, `<span class="count">2</span> ledger timeout after …`)

	// Redrive the card group.
	_, action, form := c.confirm("dlq/confirm?consumer=payments&do=redrive&group="+url.QueryEscape("card declined: code …"), "<strong>3</strong> dead letters")
	c.post(action, form, "redrove 3 dead letters")
	c.get("dlq?consumer=payments", "2 of 2 dead letters", "ledger timeout")

	// A working handler applies each once.
	applied := map[string]int{}
	var mu sync.Mutex
	st, err := core.OpenStore[*sql.Tx](ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	source, err := core.OpenSource(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := core.New(source, st, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		mu.Lock()
		applied[m.ID]++
		mu.Unlock()
		return nil
	}, core.WithName("payments"))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()
	servicetest.WaitFor(t, 30*time.Second, "three messages applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(applied) == 3
	})
	stop()
	<-done
	st.Close()
	for _, id := range []string{"pay-1", "pay-2", "pay-3"} {
		if applied[id] != 1 {
			t.Errorf("%s applied %d times, want 1 (%v)", id, applied[id], applied)
		}
	}

	// Purge one ticked message, then the rest of the group.
	var ref string
	if err := dlq.Scan(ctx, func(p *admin.Parked) error {
		if p.ID == "pay-4" {
			ref = p.Ref
		}
		return nil
	}); err != nil || ref == "" {
		t.Fatalf("pay-4 not parked: %v", err)
	}
	_, action, form = c.confirm("dlq/confirm?consumer=payments&do=purge&ref="+url.QueryEscape(ref), "<strong>1</strong> dead letters", "pay-4")
	c.post(action, form, "purged 1 dead letters")
	_, action, form = c.confirm("dlq/confirm?consumer=payments&do=purge-all&cause=ledger", "<strong>1</strong> dead letters", "pay-5")
	c.post(action, form, "purged 1 dead letters")
	c.get("dlq?consumer=payments", "0 of 0 dead letters")

	// The lookup shows the claims; forget needs the id typed again.
	c.get("lookup?consumer=payments&ids="+url.QueryEscape("pay-1\npay-4"), "<td>pay-1</td>\n<td>yes</td>", "<td>pay-4</td>\n<td>no</td>")
	_, action, form = c.confirm("forget?consumer=payments&id=pay-1", "Forget the claim", "Claimed")
	if action != "forget" {
		t.Fatalf("forget posts to %q", action)
	}
	form.Set("confirm", "pay-2")
	if code, _ := c.do("POST", action, form, nil); code != http.StatusBadRequest {
		t.Errorf("forget with the wrong id typed: %d, want 400", code)
	}
	other := cloneForm(form)
	other.Set("id", "pay-2")
	other.Set("confirm", "pay-2")
	if code, _ := c.do("POST", action, other, nil); code != http.StatusForbidden {
		t.Errorf("forget of another id with pay-1's token: %d, want 403", code)
	}
	form.Set("confirm", "pay-1")
	c.post(action, form, "forgot 1 claims of consumer payments for id pay-1")
	infos, err := s.Lookup(ctx, "payments", []string{"pay-1", "pay-2"})
	if err != nil {
		t.Fatal(err)
	}
	if infos[0].Claimed || !infos[1].Claimed {
		t.Errorf("after forgetting pay-1: %+v", infos)
	}
	l := logs.String()
	for _, want := range []string{`action="dlq redrive" consumer=payments queue=` + q, `count=3 group="card declined: code …"`,
		`action="dlq purge"`, `action=forget consumer=payments id=pay-1 count=1`} {
		if !strings.Contains(l, want) {
			t.Errorf("no %q in the log:\n%s", want, l)
		}
	}
	if strings.Count(l, "user=alice") < 4 {
		t.Errorf("actions logged without their user:\n%s", l)
	}
}

// On Postgres: the overview counts the claims and shows the table size.
func TestPostgresOverview(t *testing.T) {
	pg := servicetest.PostgresURL(t)
	ctx := context.Background()
	table := "console_" + randomHex(4)
	sep := "?"
	if strings.Contains(pg, "?") {
		sep = "&"
	}
	raw := pg + sep + "table=" + table
	s, err := admin.OpenStore(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Claims through a consumer on the memory broker.
	name := "console-pg-" + randomHex(4)
	u := "mem://orders?broker=" + name
	pub, err := core.OpenPublisher(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := pub.Publish(ctx, "", &core.Message{ID: fmt.Sprint("o-", i), Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	pub.Close()
	t.Cleanup(func() { dropTable(t, s, table) })
	applyAll(ctx, t, u, raw, "orders", 3)
	h, err := console.New(console.Config{Store: s, Consumers: []console.Consumer{{Name: "orders"}}})
	if err != nil {
		t.Fatal(err)
	}
	c := mount(t, h)
	page := c.get("", "Dedup table "+table, "3 claims", "on disk with indexes", "<td class=\"num\">3</td>", "no dead-letter queue given",
		`<p class="estimate">3 claims`, "Now: counted up to 10,000 (pg_class.reltuples is unknown until the first ANALYZE)")
	if strings.Contains(page, "postgres://") {
		t.Errorf("the overview shows the store URL:\n%s", page)
	}
	// After ANALYZE the table-wide figure is the catalog's estimate, on
	// the next view, while the per-consumer count stays the kept one.
	var pool *pgxpool.Pool
	if !s.As(&pool) {
		t.Fatal("the Postgres store hands out no pool")
	}
	if _, err := pool.Exec(ctx, "ANALYZE "+table); err != nil {
		t.Fatal(err)
	}
	c.get("", `<p class="estimate">about 3 claims`, "Now: estimate from pg_class.reltuples, updated by ANALYZE and autovacuum, statistics taken",
		"size: pg_total_relation_size, with indexes", "Per consumer: a full count", "<td class=\"num\">3</td>")
	c.get("lookup?consumer=orders&ids=o-1", "<td>o-1</td>\n<td>yes</td>")
}

// applyAll consumes n messages from sourceURL into the Postgres store at
// storeURL as consumer.
func applyAll(ctx context.Context, t *testing.T, sourceURL, storeURL, consumer string, n int) {
	t.Helper()
	st, err := core.OpenStore[pgx.Tx](ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	src, err := core.OpenSource(ctx, sourceURL)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := 0
	cons, err := core.New(src, st, func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		mu.Lock()
		seen++
		mu.Unlock()
		return nil
	}, core.WithName(consumer))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()
	servicetest.WaitFor(t, 30*time.Second, "messages applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen >= n
	})
	stop()
	<-done
}

// dropTable drops a test's dedup table and its lease table.
func dropTable(t *testing.T, s *admin.Store, table string) {
	var pool *pgxpool.Pool
	if !s.As(&pool) {
		t.Errorf("the Postgres store hands out no pool")
		return
	}
	if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+", "+table+"_leases"); err != nil {
		t.Logf("dropping %s: %v", table, err)
	}
}

// Without a known user (no password, or an authentication that does not
// tell the console who acts) a token is bound to its action, not to the
// connection that fetched it: a post on a new connection passes, a token
// of another action does not. Where a user is known, the token is bound
// to that user.
func TestTokensWithoutAUser(t *testing.T) {
	s, _ := openSQLite(t)
	name := "console-" + randomHex(4)
	b := parkMem(t, name, "payments", []string{"a-1", "a-2"}, []string{"boom", "boom"})
	h, err := console.New(console.Config{Store: s, Logger: slog.New(slog.DiscardHandler),
		User:      func(r *http.Request) string { return r.Header.Get("X-Operator") },
		Consumers: []console.Consumer{{Name: "payments", DeadLetters: &memDLQ{b, "payments"}}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	// Every request on a connection of its own, as a browser's may be.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	do := func(method, path string, form url.Values, operator string) (int, string) {
		t.Helper()
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, err := http.NewRequest(method, srv.URL+"/"+path, body)
		if err != nil {
			t.Fatal(err)
		}
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if operator != "" {
			req.Header.Set("X-Operator", operator)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	formOf := func(path, operator string) url.Values {
		t.Helper()
		code, page := do("GET", path, nil, operator)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, code, page)
		}
		f := url.Values{}
		for _, m := range hiddenInput.FindAllStringSubmatch(page, -1) {
			f.Add(html.UnescapeString(m[1]), html.UnescapeString(m[2]))
		}
		return f
	}
	anonymous := formOf("forget?consumer=payments&id=a-1", "")
	anonymous.Set("confirm", "a-1")
	redrive := formOf("dlq/confirm?consumer=payments&do=redrive-all", "")
	alice := formOf("forget?consumer=payments&id=a-1", "alice")
	alice.Set("confirm", "a-1")
	for _, c := range []struct {
		what     string
		path     string
		form     url.Values
		operator string
		want     int
	}{
		{"a redrive's token for a forget", "forget", withToken(anonymous, redrive.Get("token")), "", http.StatusForbidden},
		{"a token made for no user, by a known user", "forget", anonymous, "mallory", http.StatusForbidden},
		{"alice's token, by bob", "forget", alice, "bob", http.StatusForbidden},
		{"alice's token, by no known user", "forget", alice, "", http.StatusForbidden},
		{"alice's token, by alice", "forget", alice, "alice", http.StatusOK},
		{"a token made for no user, by no known user", "forget", anonymous, "", http.StatusOK},
	} {
		if code, page := do("POST", c.path, c.form, c.operator); code != c.want {
			t.Errorf("%s: %d, want %d\n%s", c.what, code, c.want, page)
		}
	}
}

// withToken is f with its token replaced.
func withToken(f url.Values, token string) url.Values {
	g := cloneForm(f)
	g.Set("token", token)
	return g
}
