package console

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/redact"
)

// DefaultStatsEvery is Config.StatsEvery's default.
const DefaultStatsEvery = 5 * time.Minute

// DefaultSampleEvery is Config.SampleEvery's default.
const DefaultSampleEvery = 10 * time.Second

// Config is what the console shows and how it acts.
type Config struct {
	// Store is the consumers' dedup store (admin.OpenStore). Required.
	Store *admin.Store
	// Consumers are the consumers the console shows, in this order. At
	// least one is required; their names are unique.
	Consumers []Consumer
	// Outbox is the service's outbox table (admin.OpenOutbox); nil shows
	// no outbox.
	Outbox admin.OutboxTable
	// ReadOnly refuses every action (403 Forbidden) and hides the buttons.
	ReadOnly bool
	// Logger receives a line for every action and every message body
	// shown: who, what, how many. Default slog.Default().
	Logger *slog.Logger
	// User returns who is acting, for the log and for the tokens that
	// guard actions; "" when it does not know. Default: the basic-auth
	// user name. Where no user is known (a console without a password, or
	// behind an authentication that does not tell it, such as a session
	// cookie), a token is bound to its action only and the log names the
	// remote address: set User to the service's own to bind tokens to
	// users and name them in the log.
	User func(*http.Request) string
	// RedactBody returns what the console shows of a dead letter's body
	// when an operator asks for it (it is hidden until then). Default:
	// the body as it is.
	RedactBody func(consumer string, p *admin.Parked) []byte
	// StatsEvery is how long the dedup table's per-consumer statistics
	// are kept before a page view counts them again: admin.Store.Stats
	// counts every row, so this bounds the scans the console causes. The
	// table-wide figure comes from admin.Store.Estimate on every view
	// instead, which runs bounded queries only. Default
	// DefaultStatsEvery.
	StatsEvery time.Duration
	// SampleEvery is how often the console samples Consumer.Stats of
	// each consumer that has it, for the overview's processed messages
	// and duplicates per minute over the last hour, and how long it keeps
	// the store's claims per minute it shows for the consumers without
	// Stats (admin.Store.ClaimsPerMinute) before a page view asks again.
	// It is at most a minute. Default DefaultSampleEvery (10 seconds).
	SampleEvery time.Duration
	// Context bounds the sampling of Consumer.Stats, which starts at New
	// and stops when Context ends. Default context.Background(): the
	// sampling lasts as long as the process. Without any Consumer.Stats
	// nothing is sampled and Context is not used.
	Context context.Context
}

// Consumer is one consumer the console shows.
type Consumer struct {
	// Name is the consumer's idemq name, as its claims are recorded.
	// Required.
	Name string
	// DeadLetters is the consumer's dead-letter queue
	// (admin.OpenDeadLetters); nil shows none. The console serializes its
	// calls on it.
	DeadLetters admin.DeadLetterQueue
	// SourceURL is the consumer's source URL, to compare the store's
	// retention with the broker's redelivery horizon (admin.CheckHorizon);
	// "" skips the comparison. It is shown without credentials.
	SourceURL string
	// Stats returns the consumer's running decision counts: set it to the
	// running core.Consumer's Stats method when the console is mounted in
	// the service that runs that Consumer. The overview then shows the
	// consumer's processed messages and duplicates per minute over the
	// last hour, sampled every Config.SampleEvery, and its totals since
	// it started. nil shows the claims per minute the store recorded
	// instead, without duplicates. It is called from the console's own
	// goroutine and from page views.
	Stats func() core.Stats
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// handler is the console.
type handler struct {
	cfg       Config
	log       *slog.Logger
	secret    []byte
	consumers map[string]*consumerState
	order     []*consumerState
	pages     map[string]*template.Template
	mux       *http.ServeMux
	cop       *http.CrossOriginProtection

	stats  kept[admin.TableStats]   // the dedup table's full count
	recent kept[admin.RecentClaims] // the store's claims per minute

	// samplerDone is closed when the sampler of Consumer.Stats ends; nil
	// when none runs.
	samplerDone chan struct{}
}

// consumerState is a consumer and what the console keeps of it.
type consumerState struct {
	Consumer
	dlqMu sync.Mutex // DeadLetterQueue is not safe for concurrent use

	hzMu      sync.Mutex
	hz        *horizonResult
	hzRunning bool

	hist *history // nil without Stats
}

// horizonResult is a kept admin.CheckHorizon.
type horizonResult struct {
	At  time.Time
	H   admin.Horizon
	Err string
}

// counted is a count the console keeps: V, counted at At in Took, or
// the count's error.
type counted[T any] struct {
	At   time.Time
	Took time.Duration
	V    T
	Err  string
	err  error
}

// kept keeps the last count of one kind, so that page views do not count
// again each time. One count runs at a time; others wait for it.
type kept[T any] struct {
	mu   sync.Mutex
	last *counted[T]
}

// get returns the kept count, counting again with count when there is
// none or it is older than every. The count outlives a viewer who leaves,
// so that it is kept; timeout bounds it.
func (k *kept[T]) get(ctx context.Context, every, timeout time.Duration, count func(context.Context) (T, error)) *counted[T] {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.last != nil && time.Since(k.last.At) < every {
		return k.last
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	start := time.Now()
	v, err := count(ctx)
	c := &counted[T]{At: time.Now(), Took: time.Since(start), V: v, err: err}
	if err != nil {
		c.Err = err.Error()
	}
	k.last = c
	return c
}

// New returns the console for cfg. Its errors name the field of cfg that
// is missing or wrong.
func New(cfg Config) (http.Handler, error) {
	if cfg.Store == nil {
		return nil, errors.New("console: Config.Store is required")
	}
	if len(cfg.Consumers) == 0 {
		return nil, errors.New("console: Config.Consumers is empty: give at least one consumer")
	}
	if cfg.StatsEvery < 0 {
		return nil, fmt.Errorf("console: Config.StatsEvery %v is negative", cfg.StatsEvery)
	}
	if cfg.StatsEvery == 0 {
		cfg.StatsEvery = DefaultStatsEvery
	}
	switch {
	case cfg.SampleEvery < 0:
		return nil, fmt.Errorf("console: Config.SampleEvery %v is negative", cfg.SampleEvery)
	case cfg.SampleEvery > time.Minute:
		return nil, fmt.Errorf("console: Config.SampleEvery %v is over a minute: the overview counts per minute", cfg.SampleEvery)
	case cfg.SampleEvery == 0:
		cfg.SampleEvery = DefaultSampleEvery
	}
	if cfg.Context == nil {
		cfg.Context = context.Background()
	}
	h := &handler{cfg: cfg, log: cfg.Logger, consumers: map[string]*consumerState{}, cop: http.NewCrossOriginProtection()}
	if h.log == nil {
		h.log = slog.Default()
	}
	for i, c := range cfg.Consumers {
		switch {
		case c.Name == "":
			return nil, fmt.Errorf("console: Config.Consumers[%d].Name is empty", i)
		case h.consumers[c.Name] != nil:
			return nil, fmt.Errorf("console: Config.Consumers[%d].Name %q is given twice", i, c.Name)
		}
		if c.SourceURL != "" {
			if _, err := redact.ParseURL(c.SourceURL); err != nil {
				return nil, fmt.Errorf("console: Config.Consumers[%d].SourceURL: %v", i, err)
			}
		}
		cs := &consumerState{Consumer: c}
		if c.Stats != nil {
			cs.hist = newHistory()
		}
		h.consumers[c.Name] = cs
		h.order = append(h.order, cs)
	}
	h.secret = make([]byte, 32)
	if _, err := rand.Read(h.secret); err != nil {
		return nil, fmt.Errorf("console: drawing the token secret: %w", err)
	}
	if err := h.parseTemplates(); err != nil {
		return nil, err
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	m := http.NewServeMux()
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /{$}", h.overview)
	m.HandleFunc("GET /dlq", h.dlqList)
	m.HandleFunc("GET /dlq/message", h.dlqMessage)
	m.HandleFunc("GET /dlq/confirm", h.confirming(h.dlqConfirm))
	m.HandleFunc("POST /dlq/act", h.dlqAct)
	m.HandleFunc("GET /lookup", h.lookup)
	m.HandleFunc("GET /forget", h.confirming(h.forgetConfirm))
	m.HandleFunc("POST /forget", h.forgetAct)
	m.HandleFunc("GET /outbox", h.outboxPage)
	m.HandleFunc("GET /outbox/confirm", h.confirming(h.outboxConfirm))
	m.HandleFunc("POST /outbox/act", h.outboxAct)
	h.mux = m
	h.startSampler()
	return h, nil
}

// ServeHTTP serves the console's pages and actions.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	if r.Method == http.MethodPost {
		hd.Set("Cache-Control", "no-store")
		if h.cfg.ReadOnly {
			h.fail(w, r, http.StatusForbidden, readOnlyText)
			return
		}
		if err := h.cop.Check(r); err != nil {
			h.log.Warn("idemq console: refused a cross-origin request", "user", h.user(r), "path", r.URL.Path)
			h.fail(w, r, http.StatusForbidden, "cross-origin request refused")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		if err := r.ParseForm(); err != nil {
			h.fail(w, r, http.StatusBadRequest, "bad form")
			return
		}
	} else if !strings.HasPrefix(r.URL.Path, "/static/") {
		hd.Set("Cache-Control", "no-store")
	}
	h.mux.ServeHTTP(w, r)
}

// readOnlyText is the answer of a read-only console to an action, and to
// the page that confirms one.
const readOnlyText = "the console is read-only"

// confirming wraps the page that confirms an action: a read-only console
// answers it 403, as it answers the action's POST (ServeHTTP).
func (h *handler) confirming(page http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.cfg.ReadOnly {
			h.fail(w, r, http.StatusForbidden, readOnlyText)
			return
		}
		page(w, r)
	}
}

// knownUser is who makes r, "" when the console cannot tell.
func (h *handler) knownUser(r *http.Request) string {
	if h.cfg.User != nil {
		if u := h.cfg.User(r); u != "" {
			return u
		}
	}
	if u, _, ok := r.BasicAuth(); ok && u != "" {
		return u
	}
	return ""
}

// user is who makes r, for the log: the known user, else the remote
// address.
func (h *handler) user(r *http.Request) string {
	return cmp.Or(h.knownUser(r), r.RemoteAddr)
}

// tokenLife is how long a token guarding an action stays valid.
const tokenLife = 4 * time.Hour

// token returns the token a form carries to do action as the user of r.
// It is bound to the user when one is known, and never to anything of
// the connection (a browser's next request may come on another one).
// What keeps a page of another origin from acting through an operator's
// browser is that it cannot read the token (the same-origin policy; the
// console allows no other origin to read it or frame it), and the
// same-origin check of every POST (ServeHTTP).
func (h *handler) token(r *http.Request, action string) string {
	exp := strconv.FormatInt(time.Now().Add(tokenLife).Unix(), 10)
	return exp + "." + h.mac(h.knownUser(r), action, exp)
}

func (h *handler) mac(user, action, exp string) string {
	m := hmac.New(sha256.New, h.secret)
	m.Write([]byte("idemq-console\x00" + action + "\x00" + user + "\x00" + exp))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkToken reports whether r carries a valid token for action by its
// user (token); when not, it answers 403 and logs the refusal.
func (h *handler) checkToken(w http.ResponseWriter, r *http.Request, action string) bool {
	tok := r.PostForm.Get("token")
	exp, sig, ok := strings.Cut(tok, ".")
	if ok {
		n, err := strconv.ParseInt(exp, 10, 64)
		ok = err == nil && time.Now().Unix() <= n && hmac.Equal([]byte(sig), []byte(h.mac(h.knownUser(r), action, exp)))
	}
	if !ok {
		h.log.Warn("idemq console: refused an action without a valid token", "user", h.user(r), "action", action)
		h.fail(w, r, http.StatusForbidden, "this form has no valid token for this action (expired, or not made by this console for you): reload the page and try again")
	}
	return ok
}

// consumer returns the consumer the request names, answering 404 when
// there is none.
func (h *handler) consumer(w http.ResponseWriter, r *http.Request) *consumerState {
	name := r.FormValue("consumer")
	c := h.consumers[name]
	if c == nil {
		h.fail(w, r, http.StatusNotFound, fmt.Sprintf("no consumer %q in this console", name))
	}
	return c
}

// noDeadLetters answers 404 and reports true when c has no dead-letter
// queue in this console.
func (h *handler) noDeadLetters(w http.ResponseWriter, r *http.Request, c *consumerState) bool {
	if c.DeadLetters != nil {
		return false
	}
	h.fail(w, r, http.StatusNotFound, fmt.Sprintf("consumer %s has no dead-letter queue in this console", c.Name))
	return true
}

// dlqConsumer returns the consumer the request names when it has a
// dead-letter queue in this console, answering 404 and returning nil
// when not.
func (h *handler) dlqConsumer(w http.ResponseWriter, r *http.Request) *consumerState {
	c := h.consumer(w, r)
	if c == nil || h.noDeadLetters(w, r, c) {
		return nil
	}
	return c
}

// scan scans c's dead-letter queue, one scan or action on it at a time.
func (c *consumerState) scan(ctx context.Context, f func(*admin.Parked) error) error {
	c.dlqMu.Lock()
	defer c.dlqMu.Unlock()
	return c.DeadLetters.Scan(ctx, f)
}

// noOutbox answers 404 and reports true when the console has no outbox
// table.
func (h *handler) noOutbox(w http.ResponseWriter, r *http.Request) bool {
	if h.cfg.Outbox != nil {
		return false
	}
	h.fail(w, r, http.StatusNotFound, "this console has no outbox table")
	return true
}

// statsFor returns the kept statistics of the dedup table, counting them
// again when they are older than StatsEvery.
func (h *handler) statsFor(ctx context.Context) *counted[admin.TableStats] {
	return h.stats.get(ctx, h.cfg.StatsEvery, 2*time.Minute, h.cfg.Store.Stats)
}

// horizonEvery is how long a horizon check is kept.
const horizonEvery = time.Hour

// horizon returns c's kept horizon check, nil while the first one runs;
// it starts one in the background when none is kept or it is old.
func (h *handler) horizon(c *consumerState) *horizonResult {
	if c.SourceURL == "" {
		return nil
	}
	c.hzMu.Lock()
	defer c.hzMu.Unlock()
	if (c.hz == nil || time.Since(c.hz.At) > horizonEvery) && !c.hzRunning {
		c.hzRunning = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			hz, err := admin.CheckHorizon(ctx, h.cfg.Store, c.SourceURL)
			res := &horizonResult{At: time.Now(), H: hz}
			if err != nil {
				res.Err = redact.Error(err, c.SourceURL)
			}
			c.hzMu.Lock()
			c.hz, c.hzRunning = res, false
			c.hzMu.Unlock()
		}()
	}
	return c.hz
}

// errorText is err without the credentials of c's source URL.
func (c *consumerState) errorText(err error) string {
	if c.SourceURL != "" {
		return redact.Error(err, c.SourceURL)
	}
	return err.Error()
}
