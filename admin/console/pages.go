package console

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/units"
	"github.com/idemq/idemq/outbox"
)

// Bounds on what one page reads.
const (
	overviewScan = 1000  // dead letters counted on the overview
	pageScan     = 10000 // dead letters a page reads
	groupShown   = 200   // messages listed per cause group
	confirmShown = 50    // ids a confirmation page lists
	outboxShown  = 500   // parked outbox rows listed
	lookupMax    = 100   // ids one lookup takes
)

// actionTimeout bounds an action, which goes on when the operator's
// browser goes away, so that it is not left half done.
const actionTimeout = 10 * time.Minute

// errStop ends a scan early.
var errStop = errors.New("stop")

var pageNames = []string{"error", "overview", "dlq", "message", "dlqconfirm", "result", "lookup", "forget", "outbox", "outboxconfirm"}

// parseTemplates parses each page with the layout.
func (h *handler) parseTemplates() error {
	funcs := template.FuncMap{
		"ago":   func(t time.Time) string { return units.Age(time.Since(t)) },
		"utc":   func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"age":   units.Age,
		"bytes": units.Bytes,
		"sortedKeys": func(m map[string]string) []string {
			return slices.Sorted(maps.Keys(m))
		},
		// plural is one when n is 1, else many.
		"plural": func(n int, one, many string) string {
			if n == 1 {
				return one
			}
			return many
		},
		"thousands": func(n int) string { return units.Count(int64(n)) },
	}
	h.pages = map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return fmt.Errorf("console: template %s: %w", name, err)
		}
		h.pages[name] = t
	}
	return nil
}

// page is what every page's template receives.
type page struct {
	Title     string
	Base      string // the relative path to the console's root, ending in '/'
	ReadOnly  bool
	Consumers []string
	Outbox    bool
	D         any
}

// render writes the page name with data d.
func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, name, title string, d any) {
	p := page{Title: title, Base: base(r), ReadOnly: h.cfg.ReadOnly, Outbox: h.cfg.Outbox != nil, D: d}
	for _, c := range h.order {
		p.Consumers = append(p.Consumers, c.Name)
	}
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		h.log.Error("idemq console: rendering a page", "page", name, "error", err)
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail answers with an error page.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	h.render(w, r, status, "error", http.StatusText(status), msg)
}

// base returns the path from r's page to the console's root, relative,
// so that the console works under whatever prefix it is mounted.
func base(r *http.Request) string {
	n := strings.Count(r.URL.Path, "/") - 1
	if n <= 0 {
		return "./"
	}
	return strings.Repeat("../", n)
}

// consumerView is one consumer on the overview.
type consumerView struct {
	Name        string
	Claims      *admin.ConsumerStats
	HasDLQ      bool
	DeadLetters int
	MoreDead    bool
	DLQName     string
	DLQErr      string
	Source      string // redacted
	Horizon     *horizonResult
	Verdict     string
	Short       bool
	Over        *overTimeView // nil without Consumer.Stats
	Recent      *recentView   // the store's claims per minute, without Consumer.Stats
	RecentErr   string
}

type overviewData struct {
	Est       *estimateView // nil when the store cannot estimate
	Stats     *counted[admin.TableStats]
	Claims    claimsSplit
	Every     time.Duration
	Sample    time.Duration
	Consumers []consumerView
	Sampled   bool                         // some consumer has Stats
	Recent    *counted[admin.RecentClaims] // nil when every consumer has Stats, or the store cannot count
	RecentCap int
	Outbox    *outboxStatsView
}

// claimsSplit is the counted claims of the dedup table split between the
// consumers the console shows and the others, so that the overview's
// figures add up.
type claimsSplit struct {
	Shown          int64 // by the consumers shown
	ShownNames     int   // how many consumers are shown
	Other          int64 // by consumers the console does not show
	OtherConsumers int   // how many those are
	Others         []admin.ConsumerStats
	MoreOthers     int // those not named
}

// othersNamed is how many of the consumers not shown the overview names.
const othersNamed = 5

// split splits st's claims between the consumers of h and the others,
// the others with the most claims first.
func (h *handler) split(st admin.TableStats) claimsSplit {
	cs := claimsSplit{ShownNames: len(h.order)}
	for _, c := range st.Consumers {
		if h.consumers[c.Consumer] != nil {
			cs.Shown += c.Rows
			continue
		}
		cs.Other += c.Rows
		cs.Others = append(cs.Others, c)
	}
	slices.SortStableFunc(cs.Others, func(a, b admin.ConsumerStats) int { return cmp.Compare(b.Rows, a.Rows) })
	cs.OtherConsumers = len(cs.Others)
	if len(cs.Others) > othersNamed {
		cs.MoreOthers = len(cs.Others) - othersNamed
		cs.Others = cs.Others[:othersNamed]
	}
	return cs
}

// estimateView is an admin.Store.Estimate asked for one view.
type estimateView struct {
	E    admin.TableEstimate
	Took time.Duration
	Err  string
}

// estimate asks the store for its cheap estimate of the dedup table; nil
// when the store has none (errors.ErrUnsupported).
func (h *handler) estimate(ctx context.Context) *estimateView {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	e, err := h.cfg.Store.Estimate(ctx)
	if errors.Is(err, errors.ErrUnsupported) {
		return nil
	}
	v := &estimateView{E: e, Took: time.Since(start)}
	if err != nil {
		v.Err = err.Error()
	}
	return v
}

type outboxStatsView struct {
	Table string
	St    outbox.TableStats
	Err   string
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d := overviewData{Est: h.estimate(ctx), Stats: h.statsFor(ctx), Every: h.cfg.StatsEvery, Sample: h.cfg.SampleEvery,
		Recent: h.recentFor(ctx), RecentCap: admin.RecentCap}
	d.Claims = h.split(d.Stats.V)
	for _, c := range h.order {
		v := consumerView{Name: c.Name, HasDLQ: c.DeadLetters != nil}
		switch {
		case c.hist != nil:
			v.Over = c.hist.view(c.Stats())
			d.Sampled = true
		case d.Recent != nil && d.Recent.Err != "":
			v.RecentErr = d.Recent.Err
		case d.Recent != nil:
			v.Recent = recentOf(d.Recent, c.Name)
		}
		for i := range d.Stats.V.Consumers {
			if d.Stats.V.Consumers[i].Consumer == c.Name {
				v.Claims = &d.Stats.V.Consumers[i]
			}
		}
		if c.DeadLetters != nil {
			v.DLQName = c.DeadLetters.Name()
			err := c.scan(ctx, func(*admin.Parked) error {
				if v.DeadLetters == overviewScan {
					v.MoreDead = true
					return errStop
				}
				v.DeadLetters++
				return nil
			})
			if err != nil && !errors.Is(err, errStop) {
				v.DLQErr = c.errorText(err)
			}
		}
		if c.SourceURL != "" {
			v.Source = redact.URL(c.SourceURL)
			v.Horizon = h.horizon(c)
			if v.Horizon != nil && v.Horizon.Err == "" {
				v.Verdict, v.Short = verdict(v.Horizon.H)
			}
		}
		d.Consumers = append(d.Consumers, v)
	}
	if h.cfg.Outbox != nil {
		ov := &outboxStatsView{Table: h.cfg.Outbox.Table()}
		st, err := h.cfg.Outbox.Stats(ctx)
		if err != nil {
			ov.Err = err.Error()
		}
		ov.St = st
		d.Outbox = ov
	}
	h.render(w, r, http.StatusOK, "overview", "Overview", d)
}

// verdict says what a horizon check found, and whether claims are pruned
// too soon.
func verdict(hz admin.Horizon) (string, bool) {
	ret, hor := "unknown", "unknown"
	if hz.RetentionKnown {
		ret = hz.Retention.String()
	}
	switch {
	case !hz.HorizonKnown:
	case hz.Unbounded():
		hor = "unbounded"
	default:
		hor = hz.Horizon.String()
	}
	s := fmt.Sprintf("retention %s, redelivery horizon %s: ", ret, hor)
	switch {
	case hz.Short():
		return s + "TOO SHORT: a message redelivered after its claim is pruned is applied twice (raise the store's retention or bound the broker's)", true
	case !hz.RetentionKnown || !hz.HorizonKnown:
		return s + "cannot compare", false
	}
	return s + "claims outlive redeliveries", false
}

// formSel is what a page's selection of dead letters or of outbox rows
// reads from the form either way: the action, the cause and the age
// filters.
type formSel struct {
	Do           string // redrive, purge, redrive-all, purge-all; "" on a list
	Cause        string
	Older, Newer string
}

// readFormSel reads the shared part of a selection from r's form, and
// the ages its filters give.
func readFormSel(r *http.Request) (s formSel, older, newer time.Duration, err error) {
	s = formSel{Do: r.FormValue("do"), Cause: r.FormValue("cause"), Older: r.FormValue("older"), Newer: r.FormValue("newer")}
	if older, err = parseAge("older", s.Older); err == nil {
		newer, err = parseAge("newer", s.Newer)
	}
	return s, older, newer, err
}

// parseAge parses an age filter: a Go duration such as 90m or 24h.
func parseAge(name, v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s: %q is not a duration such as 90m or 24h", name, v)
	}
	return d, nil
}

// action splits Do into the action and whether it takes everything the
// filters choose.
func (s formSel) action() (action string, all bool) {
	return strings.CutSuffix(s.Do, "-all")
}

// checkAction reports an action other than redrive and purge, and
// whether the action takes everything the filters choose.
func (s formSel) checkAction() (all bool, err error) {
	action, all := s.action()
	if action != "redrive" && action != "purge" {
		return all, fmt.Errorf("unknown action %q", s.Do)
	}
	return all, nil
}

// addFields appends the hidden fields of the shared part to f.
func (s formSel) addFields(f *fieldList) {
	f.add("do", s.Do)
	f.add("cause", s.Cause)
	f.add("older", s.Older)
	f.add("newer", s.Newer)
}

// actionSel is the selection of an action: of dead letters or of outbox
// rows.
type actionSel interface {
	check() error
	action() (action string, all bool)
}

// readAction reads the selection of an action from r with parse, checks
// that it chooses something, and returns it with the action; a bad one
// is answered 400, and ok is false.
func readAction[S actionSel](h *handler, w http.ResponseWriter, r *http.Request, parse func(*http.Request) (S, error)) (sel S, action string, ok bool) {
	sel, err := parse(r)
	if err == nil {
		err = sel.check()
	}
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return sel, "", false
	}
	action, _ = sel.action()
	return sel, action, true
}

// selection is a page's filters and an action's choice of dead letters
// as the form gives them, and in sel the admin.Selection they make.
type selection struct {
	formSel
	Refs  []string
	Group string
	ID    string
	sel   admin.Selection
}

// parseSelection reads a selection from r's form.
func parseSelection(r *http.Request) (selection, error) {
	f, older, newer, err := readFormSel(r)
	s := selection{formSel: f, Refs: r.Form["ref"], Group: r.FormValue("group"), ID: r.FormValue("id")}
	s.sel = admin.Selection{Refs: s.Refs, Group: s.Group, Cause: s.Cause, OlderThan: older, NewerThan: newer}
	if s.ID != "" {
		s.sel.IDs = []string{s.ID}
	}
	return s, err
}

// check reports an action's selection that chooses nothing in particular.
func (s selection) check() error {
	all, err := s.checkAction()
	if err == nil && !all && len(s.Refs) == 0 && s.Group == "" {
		err = errors.New("no message chosen: tick messages, or choose a group or every message shown")
	}
	return err
}

// match reports whether p passes the selection at now.
func (s selection) match(p *admin.Parked, now time.Time) bool { return s.sel.Match(p, now) }

// field is a hidden form field.
type field struct{ Name, Value string }

// fields are the hidden fields that carry the selection to the next
// step.
func (s selection) fields() []field {
	var f fieldList
	s.addFields(&f)
	f.add("ref", s.Refs...)
	f.add("group", s.Group)
	f.add("id", s.ID)
	return f
}

// fieldList collects hidden fields, leaving out empty values.
type fieldList []field

// add appends a field named n for each non-empty value of vs.
func (f *fieldList) add(n string, vs ...string) {
	for _, v := range vs {
		if v != "" {
			*f = append(*f, field{n, v})
		}
	}
}

type dlqData struct {
	Consumer  string
	Queue     string
	Sel       selection
	Scanned   int
	Truncated bool
	Matched   int
	Groups    []*admin.DeadLetterGroup
	Err       string
}

func (h *handler) dlqList(w http.ResponseWriter, r *http.Request) {
	c := h.dlqConsumer(w, r)
	if c == nil {
		return
	}
	sel, err := parseSelection(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	d := dlqData{Consumer: c.Name, Queue: c.DeadLetters.Name(), Sel: sel}
	now := time.Now()
	groups := admin.NewGrouper(groupShown)
	err = c.scan(r.Context(), func(p *admin.Parked) error {
		if d.Scanned == pageScan {
			d.Truncated = true
			return errStop
		}
		d.Scanned++
		if !sel.match(p, now) {
			return nil
		}
		d.Matched++
		q := *p
		q.Body, q.Headers = nil, nil // not shown here
		groups.Add(&q)
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		d.Err = c.errorText(err)
	}
	d.Groups = groups.Groups()
	h.render(w, r, http.StatusOK, "dlq", "Dead letters of "+c.Name, d)
}

type messageData struct {
	Consumer string
	Copies   []*messageView
	Ref      string
}

type messageView struct {
	P        *admin.Parked
	BodySize int
	Shown    bool
	Body     string
	Binary   bool
}

func (h *handler) dlqMessage(w http.ResponseWriter, r *http.Request) {
	c := h.dlqConsumer(w, r)
	if c == nil {
		return
	}
	ref := r.FormValue("ref")
	showBody := r.FormValue("body") == "1"
	d := messageData{Consumer: c.Name, Ref: ref}
	err := c.scan(r.Context(), func(p *admin.Parked) error {
		if p.Ref == ref {
			d.Copies = append(d.Copies, &messageView{P: p, BodySize: len(p.Body)})
		}
		return nil
	})
	if err != nil {
		h.fail(w, r, http.StatusBadGateway, c.errorText(err))
		return
	}
	if len(d.Copies) == 0 {
		h.fail(w, r, http.StatusNotFound, fmt.Sprintf("no message with ref %q is parked in %s", ref, c.DeadLetters.Name()))
		return
	}
	for _, m := range d.Copies {
		if showBody {
			body := m.P.Body
			if h.cfg.RedactBody != nil {
				body = h.cfg.RedactBody(c.Name, m.P)
			}
			m.Shown = true
			if utf8.Valid(body) {
				m.Body = string(body)
			} else {
				m.Body, m.Binary = fmt.Sprintf("%x", body), true
			}
			h.log.Info("idemq console: dead letter body shown", "user", h.user(r), "consumer", c.Name, "ref", m.P.Ref, "id", m.P.ID)
		}
		m.P.Body = nil
	}
	h.render(w, r, http.StatusOK, "message", "Dead letter "+ref, d)
}

type dlqConfirmData struct {
	Consumer  string
	Queue     string
	Action    string
	Sel       selection
	Fields    []field
	Chosen    int
	IDs       []string
	Refused   int
	Retention string
	Token     string
}

// dlqAction reads an action on the dead letters of the consumer r names:
// the consumer, the selection and the action. It answers 404 for an
// unknown consumer and 400 for a bad selection, and then returns a nil
// consumer.
func (h *handler) dlqAction(w http.ResponseWriter, r *http.Request) (*consumerState, selection, string) {
	c := h.consumer(w, r)
	if c == nil {
		return nil, selection{}, ""
	}
	sel, action, ok := readAction(h, w, r, parseSelection)
	if !ok {
		return nil, sel, ""
	}
	return c, sel, action
}

func (h *handler) dlqConfirm(w http.ResponseWriter, r *http.Request) {
	c, sel, action := h.dlqAction(w, r)
	if c == nil || h.noDeadLetters(w, r, c) {
		return
	}
	d := dlqConfirmData{Consumer: c.Name, Queue: c.DeadLetters.Name(), Action: action, Sel: sel, Fields: sel.fields(),
		Token: h.token(r, "dlq-"+action+":"+c.Name)}
	guard := h.cfg.Store.RedriveGuard(false)
	if guard.Retention > 0 {
		d.Retention = guard.Retention.String()
	}
	now := time.Now()
	err := c.scan(r.Context(), func(p *admin.Parked) error {
		if !sel.match(p, now) {
			return nil
		}
		if action == "redrive" && guard.Refuses(p, now) {
			d.Refused++
			return nil
		}
		d.Chosen++
		if len(d.IDs) < confirmShown {
			d.IDs = append(d.IDs, cmp.Or(p.ID, "(no id) "+p.Ref))
		}
		return nil
	})
	if err != nil {
		h.fail(w, r, http.StatusBadGateway, c.errorText(err))
		return
	}
	h.render(w, r, http.StatusOK, "dlqconfirm", "Confirm "+action, d)
}

// resultData is what an action did.
type resultData struct {
	Text string
	Err  string
	Back string // relative to Base
}

// acted logs the action that attrs describe and answers with its result
// d: 200, or 502 when d.Err says what failed.
func (h *handler) acted(w http.ResponseWriter, r *http.Request, d resultData, attrs []any) {
	if d.Err != "" {
		h.log.Error("idemq console: action failed", append(attrs, "error", d.Err)...)
		h.render(w, r, http.StatusBadGateway, "result", "Failed", d)
		return
	}
	h.log.Info("idemq console: action", attrs...)
	h.render(w, r, http.StatusOK, "result", "Done", d)
}

func (h *handler) dlqAct(w http.ResponseWriter, r *http.Request) {
	c, sel, action := h.dlqAction(w, r)
	if c == nil || !h.checkToken(w, r, "dlq-"+action+":"+c.Name) || h.noDeadLetters(w, r, c) {
		return
	}
	force := r.PostForm.Get("force") == "1"
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), actionTimeout)
	defer cancel()
	now := time.Now()
	user := h.user(r)
	var n, refused int
	var err error
	c.dlqMu.Lock()
	if action == "redrive" {
		n, refused, err = admin.RedriveSelected(ctx, c.DeadLetters, sel.sel, h.cfg.Store.RedriveGuard(force), now, nil)
	} else {
		n, err = admin.PurgeSelected(ctx, c.DeadLetters, sel.sel, now)
	}
	c.dlqMu.Unlock()
	attrs := []any{"user", user, "action", "dlq " + action, "consumer", c.Name, "queue", c.DeadLetters.Name(), "count", n}
	if sel.Group != "" {
		attrs = append(attrs, "group", sel.Group)
	}
	if len(sel.Refs) > 0 {
		attrs = append(attrs, "refs", len(sel.Refs))
	}
	if refused > 0 {
		attrs = append(attrs, "refused", refused)
	}
	if force {
		attrs = append(attrs, "force", true)
	}
	verb := map[string]string{"redrive": "redrove", "purge": "purged"}[action]
	d := resultData{Text: fmt.Sprintf("%s %d dead letters of %s from %s", verb, n, c.Name, c.DeadLetters.Name()),
		Back: "dlq?consumer=" + url.QueryEscape(c.Name)}
	if refused > 0 {
		d.Text += fmt.Sprintf("; refused %d parked longer ago than the store keeps claims", refused)
	}
	status := http.StatusOK
	if err != nil {
		d.Err = c.errorText(err)
		if action == "redrive" {
			d.Err += " (the rest are still parked)"
		}
		status = http.StatusBadGateway
		h.log.Error("idemq console: action failed", append(attrs, "error", d.Err)...)
	} else {
		h.log.Info("idemq console: action", attrs...)
	}
	h.render(w, r, status, "result", "Done", d)
}

type lookupData struct {
	Consumer string
	IDs      string
	Infos    []admin.ClaimInfo
	Err      string
}

// splitIDs splits the ids of a lookup form: one per line, or separated
// by spaces.
func splitIDs(s string) []string { return strings.Fields(s) }

func (h *handler) lookup(w http.ResponseWriter, r *http.Request) {
	d := lookupData{Consumer: r.FormValue("consumer"), IDs: r.FormValue("ids")}
	if d.Consumer == "" && len(h.order) == 1 {
		d.Consumer = h.order[0].Name
	}
	ids := splitIDs(d.IDs)
	if len(ids) > lookupMax {
		h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("at most %d ids at a time", lookupMax))
		return
	}
	if d.Consumer != "" && len(ids) > 0 {
		infos, err := h.cfg.Store.Lookup(r.Context(), d.Consumer, ids)
		if err != nil {
			d.Err = err.Error()
		}
		d.Infos = infos
	}
	h.render(w, r, http.StatusOK, "lookup", "Lookup", d)
}

type forgetData struct {
	Consumer string
	ID       string
	Info     *admin.ClaimInfo
	Token    string
}

func forgetAction(consumer, id string) string {
	return "forget:" + strconv.Quote(consumer) + ":" + strconv.Quote(id)
}

func (h *handler) forgetConfirm(w http.ResponseWriter, r *http.Request) {
	d := forgetData{Consumer: r.FormValue("consumer"), ID: r.FormValue("id")}
	if d.Consumer == "" || d.ID == "" {
		h.fail(w, r, http.StatusBadRequest, "give a consumer and a message id")
		return
	}
	infos, err := h.cfg.Store.Lookup(r.Context(), d.Consumer, []string{d.ID})
	if err != nil {
		h.fail(w, r, http.StatusBadGateway, err.Error())
		return
	}
	d.Info = &infos[0]
	d.Token = h.token(r, forgetAction(d.Consumer, d.ID))
	h.render(w, r, http.StatusOK, "forget", "Forget "+d.ID, d)
}

func (h *handler) forgetAct(w http.ResponseWriter, r *http.Request) {
	consumer, id := r.PostForm.Get("consumer"), r.PostForm.Get("id")
	if consumer == "" || id == "" {
		h.fail(w, r, http.StatusBadRequest, "give a consumer and a message id")
		return
	}
	if !h.checkToken(w, r, forgetAction(consumer, id)) {
		return
	}
	if r.PostForm.Get("confirm") != id {
		h.fail(w, r, http.StatusBadRequest, "the id typed to confirm is not the id to forget: nothing was forgotten")
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), actionTimeout)
	defer cancel()
	n, err := h.cfg.Store.Forget(ctx, consumer, []string{id})
	attrs := []any{"user", h.user(r), "action", "forget", "consumer", consumer, "id", id, "count", n}
	d := resultData{Text: fmt.Sprintf("forgot %d claims of consumer %s for id %s", n, consumer, id),
		Back: "lookup?consumer=" + url.QueryEscape(consumer) + "&ids=" + url.QueryEscape(id)}
	if err != nil {
		d.Err = err.Error()
	}
	h.acted(w, r, d, attrs)
}

// outboxSel is a selection of parked outbox rows.
type outboxSel struct {
	formSel
	Seqs   []string
	Key    string
	filter outbox.ParkedFilter
}

// parseOutboxSel reads a selection of parked rows from r's form.
func parseOutboxSel(r *http.Request) (outboxSel, error) {
	f, older, newer, err := readFormSel(r)
	s := outboxSel{formSel: f, Seqs: r.Form["seq"], Key: r.FormValue("key")}
	s.filter = outbox.ParkedFilter{Key: s.Key, Cause: s.Cause}
	for _, v := range s.Seqs {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return s, fmt.Errorf("row %q is not a row number", v)
		}
		s.filter.Seqs = append(s.filter.Seqs, n)
	}
	if err != nil {
		return s, err
	}
	now := time.Now()
	if older > 0 {
		s.filter.ParkedBefore = now.Add(-older)
	}
	if newer > 0 {
		s.filter.ParkedAfter = now.Add(-newer)
	}
	return s, nil
}

// check reports an action's selection that chooses nothing in
// particular: the zero filter chooses every parked row.
func (s outboxSel) check() error {
	all, err := s.checkAction()
	switch {
	case err != nil:
		return err
	case !all && len(s.filter.Seqs) == 0:
		return errors.New("no row chosen: tick rows, or choose every row shown")
	case all && len(s.filter.Seqs) > 0:
		return errors.New("choose ticked rows or every row shown, not both")
	}
	return nil
}

func (s outboxSel) fields() []field {
	var f fieldList
	s.addFields(&f)
	f.add("seq", s.Seqs...)
	f.add("key", s.Key)
	return f
}

type outboxData struct {
	Table     string
	Sel       outboxSel
	St        outbox.TableStats
	Rows      []outbox.ParkedRow
	Truncated bool
	Err       string
}

func (h *handler) outboxPage(w http.ResponseWriter, r *http.Request) {
	if h.noOutbox(w, r) {
		return
	}
	sel, err := parseOutboxSel(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	d := outboxData{Table: h.cfg.Outbox.Table(), Sel: sel}
	st, err := h.cfg.Outbox.Stats(r.Context())
	if err == nil {
		d.St = st
		f := sel.filter
		f.Limit = outboxShown + 1
		d.Rows, err = h.cfg.Outbox.Parked(r.Context(), f)
		if len(d.Rows) > outboxShown {
			d.Rows, d.Truncated = d.Rows[:outboxShown], true
		}
	}
	if err != nil {
		d.Err = err.Error()
	}
	h.render(w, r, http.StatusOK, "outbox", "Outbox", d)
}

type outboxConfirmData struct {
	Table  string
	Action string
	Fields []field
	Chosen int
	IDs    []string
	Token  string
}

func (h *handler) outboxConfirm(w http.ResponseWriter, r *http.Request) {
	if h.noOutbox(w, r) {
		return
	}
	sel, action, ok := readAction(h, w, r, parseOutboxSel)
	if !ok {
		return
	}
	rows, err := h.cfg.Outbox.Parked(r.Context(), sel.filter)
	if err != nil {
		h.fail(w, r, http.StatusBadGateway, err.Error())
		return
	}
	d := outboxConfirmData{Table: h.cfg.Outbox.Table(), Action: action, Fields: sel.fields(), Chosen: len(rows),
		Token: h.token(r, "outbox-"+action)}
	for _, row := range rows {
		if len(d.IDs) == confirmShown {
			break
		}
		d.IDs = append(d.IDs, fmt.Sprintf("row %d: %s", row.Seq, row.ID))
	}
	h.render(w, r, http.StatusOK, "outboxconfirm", "Confirm "+action, d)
}

func (h *handler) outboxAct(w http.ResponseWriter, r *http.Request) {
	sel, action, ok := readAction(h, w, r, parseOutboxSel)
	if !ok || !h.checkToken(w, r, "outbox-"+action) || h.noOutbox(w, r) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), actionTimeout)
	defer cancel()
	var n int64
	var err error
	if action == "redrive" {
		n, err = h.cfg.Outbox.Redrive(ctx, sel.filter)
	} else {
		n, err = h.cfg.Outbox.Purge(ctx, sel.filter)
	}
	attrs := []any{"user", h.user(r), "action", "outbox " + action, "table", h.cfg.Outbox.Table(), "count", n}
	verb := map[string]string{"redrive": "redrove", "purge": "purged"}[action]
	d := resultData{Text: fmt.Sprintf("%s %d parked rows of %s", verb, n, h.cfg.Outbox.Table()), Back: "outbox"}
	if err != nil {
		d.Err = err.Error()
	}
	h.acted(w, r, d, attrs)
}
