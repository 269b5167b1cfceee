// Package effectstest provides a fake HTTP payment provider that
// deduplicates charges by idempotency key the way Stripe does, for the
// tests, benchmarks and examples of handlers that call out of their
// database transaction (effects.Keyer, effects.Transport).
//
// A Provider serves real HTTP on 127.0.0.1, counts what it does (charges,
// replays, conflicts) so a test can assert that each message was charged
// once, and can be made slow, failing or stuck at any time, or made to call
// a hook while a charge is in flight, to reproduce what happens when a
// consumer gives up, crashes or retries in the middle of a call.
//
// The package is test support: nothing in idemq's runtime imports it.
package effectstest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq/effects"
)

// maxBody bounds the request and response bodies read, in bytes.
const maxBody = 1 << 20

// ReplayedHeader is the response header set to "true" on an answer that
// replays a key's first answer instead of charging, as Stripe's
// Idempotent-Replayed.
const ReplayedHeader = "Idempotent-Replayed"

// Charge is one charge a Provider made: the JSON object POST /charges
// answers with and GET /charges/{id} returns.
type Charge struct {
	// ID is "ch_<n>", n counting the provider's charges from 1.
	ID string `json:"id"`
	// Account is the request's "account" ("" when absent).
	Account string `json:"account"`
	// AmountCents is the request's "amount_cents" (0 when absent).
	AmountCents int64 `json:"amount_cents"`
	// Key is the idempotency key the charge was made with.
	Key string `json:"key"`
}

// Option configures a Provider in NewProvider.
type Option func(*Provider)

// WithHeader makes the provider read the idempotency key from the header
// name instead of "Idempotency-Key" (effects.DefaultHeader), for a client
// whose effects.Transport has Header set (PayPal-Request-Id,
// X-Idempotency-Key).
func WithHeader(name string) Option {
	return func(p *Provider) { p.header = name }
}

// entry is what a provider remembers of an idempotency key.
type entry struct {
	hash [sha256.Size]byte // of the first request's canonical body
	resp []byte            // the first answer's body
	done bool              // the first request has finished
}

// Provider is a fake payment provider serving POST /charges and
// GET /charges/{id} over HTTP on 127.0.0.1, with Stripe's idempotency rules.
//
// POST /charges takes a JSON object, such as
// {"account": "acct_1", "amount_cents": 500}; other fields are allowed and
// ignored, but "account", when present, must be a string and
// "amount_cents" an integer. The Idempotency-Key header (see WithHeader) is
// required; its value is used as it is, quotes included. Per key:
//
//   - The first request charges: the charge is counted, and the answer is
//     200 with the Charge as JSON.
//   - A later request with the same body replays the first answer, byte
//     for byte (the same charge id), with the header Idempotent-Replayed:
//     true. It does not charge.
//   - A later request with another body answers 422 (idempotency_key_reused).
//   - A request that arrives while the key's first request is still being
//     processed (held by SetDelay, Hang or the OnCharge hook) answers 409
//     (idempotency_key_in_use), which a client retries.
//
// Two bodies are the same when their canonical forms are: the JSON object
// re-encoded by encoding/json, with object keys sorted, insignificant white
// space dropped and numbers kept as written. So field order and formatting
// do not matter, as with Stripe, which compares parameters, but 500 and
// 500.0 differ.
//
// A request without the key or with a body that is not such an object
// answers 400 (idempotency_key_missing, invalid_body) and, like one failed
// by FailNext, does not reach the idempotency layer: its key is not used
// up, and the next request with it charges. Errors are JSON:
// {"error": {"code": "...", "message": "..."}}.
//
// GET /charges/{id} returns a charge (the same bytes as its first answer)
// or 404, for reconciliation; the fault modes do not apply to it.
//
// Every method is safe for concurrent use, and the fault modes (SetDelay,
// FailNext, Hang, OnCharge) can be changed at any time.
type Provider struct {
	srv       *httptest.Server
	header    string
	closed    chan struct{}
	closeOnce sync.Once

	mu         sync.Mutex
	delay      time.Duration
	failN      int
	failStatus int
	hang       chan struct{} // non-nil while hung; Unhang closes it
	onCharge   func(Charge)
	entries    map[string]*entry
	charges    []Charge // charges[i].ID == "ch_<i+1>"
	byAccount  map[string]int64
	requests   int
	replays    int
	conflicts  int
	mismatches int
}

// NewProvider starts a Provider on a random port of 127.0.0.1 (loopback
// only). Close stops it.
func NewProvider(opts ...Option) *Provider {
	p := &Provider{
		header:    effects.DefaultHeader,
		closed:    make(chan struct{}),
		entries:   map[string]*entry{},
		byAccount: map[string]int64{},
	}
	for _, o := range opts {
		o(p)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", p.postCharge)
	mux.HandleFunc("GET /charges/{id}", p.getCharge)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("effectstest: listening on 127.0.0.1: %v", err))
	}
	p.srv = httptest.NewUnstartedServer(mux)
	p.srv.Listener.Close()
	p.srv.Listener = l
	p.srv.Start()
	return p
}

// URL returns the provider's base URL, http://127.0.0.1:<port>, to which
// the paths /charges and /charges/{id} are appended.
func (p *Provider) URL() string { return p.srv.URL }

// Close stops the provider and waits for its handlers to end. Requests
// held by SetDelay or Hang are cut off: their connection is dropped without
// an answer (the client sees a network error), and the charges they made
// stand. Close waits for an OnCharge hook that is running. It can be called
// more than once.
func (p *Provider) Close() {
	p.closeOnce.Do(func() {
		close(p.closed)
		p.srv.Close()
	})
}

// SetDelay makes every later POST /charges request, but those failed by
// FailNext, wait d before its answer is written (0: no delay). What the request does is done when it
// arrives, before the wait: like a real provider, which charges even when
// the client disconnects before the answer, a charge is made and counted
// at once, and its key stays in use (409 to other requests) until the
// wait ends. A wait ends early, without an answer, when the client gives
// up (the request's context ends) or the provider closes.
func (p *Provider) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// FailNext makes the next n POST /charges requests answer status (for
// example 500, 503 or 429) with the JSON error code injected_failure, at
// once and before anything else: they do not charge and do not use up
// their key, as when a gateway rejects a request before the provider
// processes it. It replaces what an earlier FailNext left; n <= 0 cancels
// it. It panics unless status is from 400 to 599.
func (p *Provider) FailNext(n int, status int) {
	if status < 400 || status > 599 {
		panic(fmt.Sprintf("effectstest: FailNext status %d is not an error status", status))
	}
	p.mu.Lock()
	p.failN, p.failStatus = max(n, 0), status
	p.mu.Unlock()
}

// Hang makes POST /charges requests (but those failed by FailNext) block
// before they answer, until Unhang, the client gives up or the provider
// closes: a stuck provider. Like SetDelay, a request still charges when it
// arrives; the answer is what waits. Requests already waiting for their
// delay block after it.
func (p *Provider) Hang() {
	p.mu.Lock()
	if p.hang == nil {
		p.hang = make(chan struct{})
	}
	p.mu.Unlock()
}

// Unhang releases the requests blocked by Hang, which then answer, and
// ends Hang for later requests.
func (p *Provider) Unhang() {
	p.mu.Lock()
	if p.hang != nil {
		close(p.hang)
		p.hang = nil
	}
	p.mu.Unlock()
}

// OnCharge sets f to be called with each new charge, right after it is
// made and counted and before its answer (nil: no hook). f runs on the
// request's handler goroutine, and the key stays in use (409 to other
// requests) while it runs, so a test can act while a charge is in flight:
// cancel the client's context, stop a consumer, kill a process. The
// request answers when f returns (after any SetDelay or Hang), unless the
// client has gone by then. Close waits for f: it must return.
func (p *Provider) OnCharge(f func(Charge)) {
	p.mu.Lock()
	p.onCharge = f
	p.mu.Unlock()
}

// Charges returns the number of charges made: first requests of a key, not
// replays or failures.
func (p *Provider) Charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

// ChargesFor returns the number of charges made with key: 0 or 1.
func (p *Provider) ChargesFor(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.entries[key]; ok {
		return 1
	}
	return 0
}

// Requests returns the number of POST /charges requests received, whatever
// their answer.
func (p *Provider) Requests() int { return p.count(&p.requests) }

// Replays returns the number of requests answered with a replay of their
// key's first answer.
func (p *Provider) Replays() int { return p.count(&p.replays) }

// Conflicts returns the number of requests answered 409 because their
// key's first request was still being processed.
func (p *Provider) Conflicts() int { return p.count(&p.conflicts) }

// Mismatches returns the number of requests answered 422 because their
// body differed from their key's first request: a client bug, such as a
// timestamp in the body or a key reused for another purpose.
func (p *Provider) Mismatches() int { return p.count(&p.mismatches) }

// count returns *n, a counter of p, read under p.mu.
func (p *Provider) count(n *int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return *n
}

// ChargesByAccount returns the sum of amount_cents of the charges made,
// by account: each account's balance, to compare with what a test's
// messages asked for. The map is a copy.
func (p *Provider) ChargesByAccount() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.byAccount)
}

// Keys returns the idempotency keys that made a charge, in the order of
// their charges.
func (p *Provider) Keys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]string, len(p.charges))
	for i, c := range p.charges {
		keys[i] = c.Key
	}
	return keys
}

// postCharge serves POST /charges.
func (p *Provider) postCharge(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.requests++
	delay, fail := p.delay, 0
	if p.failN > 0 {
		p.failN--
		fail = p.failStatus
	}
	p.mu.Unlock()
	if fail != 0 {
		writeError(w, fail, "injected_failure", "effectstest: failure injected by FailNext")
		return
	}
	key := r.Header.Get(p.header)
	if key == "" {
		p.answer(w, r, delay, http.StatusBadRequest, errorBody("idempotency_key_missing", "the "+p.header+" header is required"), false)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	var c Charge
	var canon []byte
	if err == nil {
		canon, c, err = canonical(body)
	}
	if err != nil {
		p.answer(w, r, delay, http.StatusBadRequest, errorBody("invalid_body", err.Error()), false)
		return
	}
	hash := sha256.Sum256(canon)

	p.mu.Lock()
	e := p.entries[key]
	switch {
	case e != nil && !e.done:
		p.conflicts++
		p.mu.Unlock()
		p.answer(w, r, delay, http.StatusConflict, errorBody("idempotency_key_in_use", "a request with this key is still being processed; retry later"), false)
		return
	case e != nil && e.hash != hash:
		p.mismatches++
		p.mu.Unlock()
		p.answer(w, r, delay, http.StatusUnprocessableEntity, errorBody("idempotency_key_reused", "this key was used with another request body"), false)
		return
	case e != nil:
		p.replays++
		resp := e.resp
		p.mu.Unlock()
		p.answer(w, r, delay, http.StatusOK, resp, true)
		return
	}
	c.ID, c.Key = "ch_"+strconv.Itoa(len(p.charges)+1), key
	e = &entry{hash: hash, resp: marshal(c)}
	p.entries[key] = e
	p.charges = append(p.charges, c)
	p.byAccount[c.Account] += c.AmountCents
	hook := p.onCharge
	p.mu.Unlock()
	defer func() { // also when the answer is cut off
		p.mu.Lock()
		e.done = true
		p.mu.Unlock()
	}()
	if hook != nil {
		hook(c)
	}
	p.answer(w, r, delay, http.StatusOK, e.resp, false)
}

// getCharge serves GET /charges/{id}.
func (p *Provider) getCharge(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	n, err := strconv.Atoi(strings.TrimPrefix(id, "ch_"))
	p.mu.Lock()
	var c *Charge
	if err == nil && strings.HasPrefix(id, "ch_") && n >= 1 && n <= len(p.charges) {
		c = &p.charges[n-1]
	}
	var body []byte
	if c != nil {
		body = marshal(*c)
	}
	p.mu.Unlock()
	if c == nil {
		writeError(w, http.StatusNotFound, "not_found", "no charge "+strconv.Quote(id))
		return
	}
	write(w, http.StatusOK, body, false)
}

// answer writes status and body once the delay and any Hang are over. It
// writes nothing when the client has gone, and drops the connection when
// the provider closes.
func (p *Provider) answer(w http.ResponseWriter, r *http.Request, delay time.Duration, status int, body []byte, replayed bool) {
	ctx := r.Context()
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		if !wait(ctx, p.closed, t.C) {
			return
		}
	}
	for {
		p.mu.Lock()
		h := p.hang
		p.mu.Unlock()
		if h == nil {
			break
		}
		if !wait(ctx, p.closed, h) {
			return
		}
	}
	write(w, status, body, replayed)
}

// wait waits for c. It returns false when ctx ends first, and aborts the
// handler when closed (the provider's) is closed first.
func wait[T any](ctx context.Context, closed <-chan struct{}, c <-chan T) bool {
	select {
	case <-c:
		return true
	case <-ctx.Done():
		return false
	case <-closed:
		panic(http.ErrAbortHandler) // the connection is dropped unanswered
	}
}

// canonical checks that body is a JSON object with a string "account" and
// an integer "amount_cents", if present, and returns its canonical form
// and the charge it asks for.
func canonical(body []byte) ([]byte, Charge, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return nil, Charge{}, fmt.Errorf("the body is not a JSON object: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, Charge{}, errors.New("the body has data after its JSON object")
	}
	var c Charge
	if v, ok := obj["account"]; ok {
		if c.Account, ok = v.(string); !ok {
			return nil, Charge{}, errors.New(`"account" is not a string`)
		}
	}
	if v, ok := obj["amount_cents"]; ok {
		n, ok := v.(json.Number)
		var err error
		if ok {
			c.AmountCents, err = strconv.ParseInt(string(n), 10, 64)
		}
		if !ok || err != nil {
			return nil, Charge{}, errors.New(`"amount_cents" is not an integer`)
		}
	}
	canon, err := json.Marshal(obj)
	return canon, c, err
}

// errorBody returns the JSON error {"error": {"code": code, "message": msg}}.
func errorBody(code, msg string) []byte {
	return marshal(apiError{Error: errorDetail{Code: code, Message: msg}})
}

// writeError writes the JSON error of code and msg with status.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	write(w, status, errorBody(code, msg), false)
}

// write writes a JSON answer.
func write(w http.ResponseWriter, status int, body []byte, replayed bool) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if replayed {
		h.Set(ReplayedHeader, "true")
	}
	w.WriteHeader(status)
	w.Write(body)
}

// marshal returns v as JSON and a newline.
func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only Charge and apiError, which always encode
	}
	return append(b, '\n')
}

// apiError is the JSON body of an error answer.
type apiError struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}
