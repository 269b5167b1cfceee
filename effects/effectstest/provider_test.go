package effectstest_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/effects"
	"github.com/idemq/idemq/effects/effectstest"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

// setup starts a provider closed at the test's end and returns it with a
// client that sends the keys of contexts made by keyed.
func setup(t *testing.T, opts ...effectstest.Option) (*effectstest.Provider, *http.Client) {
	t.Helper()
	p := effectstest.NewProvider(opts...)
	t.Cleanup(p.Close)
	return p, &http.Client{Transport: &effects.Transport{}}
}

// keyed returns a context carrying the "charge" key of message id for the
// consumer "billing", as Keyer.ForMessage gives a handler, and that key.
func keyed(t *testing.T, id string) (context.Context, string) {
	t.Helper()
	kr, err := effects.NewKeyer(secret)
	if err != nil {
		t.Fatal(err)
	}
	ctx := kr.ForMessage(core.ContextWithConsumerName(context.Background(), "billing"), &core.Message{ID: id}, "charge")
	key, _ := effects.IdempotencyKeyFrom(ctx)
	return ctx, key
}

func order(account string, cents int64) map[string]any {
	return map[string]any{"account": account, "amount_cents": cents}
}

// post sends body as it is and returns the answer's status, header and body.
func post(t *testing.T, c *http.Client, ctx context.Context, u, body string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u+"/charges", strings.NewReader(body))
	return do(t, c, req)
}

func do(t *testing.T, c *http.Client, req *http.Request) (int, http.Header, string) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// statusOf returns the status of err's *StatusError, 0 if it has none.
func statusOf(err error) int {
	var se *effectstest.StatusError
	if errors.As(err, &se) {
		return se.StatusCode
	}
	return 0
}

// counts is a provider's counters, to compare at once.
type counts struct{ charges, requests, replays, conflicts, mismatches int }

func countsOf(p *effectstest.Provider) counts {
	return counts{p.Charges(), p.Requests(), p.Replays(), p.Conflicts(), p.Mismatches()}
}

func TestLoopback(t *testing.T) {
	p, _ := setup(t)
	u, err := url.Parse(p.URL())
	if err != nil || u.Scheme != "http" || u.Hostname() != "127.0.0.1" {
		t.Fatalf("URL %q (%v), want http://127.0.0.1:<port>", p.URL(), err)
	}
}

func TestSameKeyReplays(t *testing.T) {
	p, c := setup(t)
	ctx, key := keyed(t, "order-1")
	first, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500))
	if err != nil {
		t.Fatal(err)
	}
	want := effectstest.Charge{ID: "ch_1", Account: "acct_1", AmountCents: 500, Key: key}
	if first != want {
		t.Fatalf("charge %+v, want %+v", first, want)
	}
	again, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500))
	if err != nil || again != first {
		t.Fatalf("repeat: %+v, %v; want %+v", again, err, first)
	}

	// The replay is the first answer to the byte, whatever the body's
	// field order and white space, and says it is one.
	status, h, body := post(t, c, ctx, p.URL(), `{"account":"acct_1","amount_cents":500}`)
	status2, _, body2 := post(t, c, ctx, p.URL(), "{ \"amount_cents\": 500,\n \"account\": \"acct_1\" }")
	if status != 200 || status2 != 200 || body != body2 {
		t.Fatalf("replays %d %q and %d %q differ", status, body, status2, body2)
	}
	if h.Get(effectstest.ReplayedHeader) != "true" || h.Get("Content-Type") != "application/json" {
		t.Errorf("replay headers %v", h)
	}
	if want := `{"id":"ch_1","account":"acct_1","amount_cents":500,"key":"` + key + `"}` + "\n"; body != want {
		t.Errorf("replay %q, want %q", body, want)
	}
	if got, want := countsOf(p), (counts{charges: 1, requests: 4, replays: 3}); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	if p.ChargesFor(key) != 1 || !slices.Equal(p.Keys(), []string{key}) {
		t.Errorf("ChargesFor %d, Keys %q", p.ChargesFor(key), p.Keys())
	}

	// GET /charges/{id} returns the same bytes; unknown ids are 404.
	req, _ := http.NewRequest(http.MethodGet, p.URL()+"/charges/ch_1", nil)
	if status, _, got := do(t, c, req); status != 200 || got != body {
		t.Errorf("GET ch_1: %d %q, want 200 %q", status, got, body)
	}
	for _, id := range []string{"ch_2", "ch_0", "ch_x", "1"} {
		req, _ := http.NewRequest(http.MethodGet, p.URL()+"/charges/"+id, nil)
		if status, _, got := do(t, c, req); status != 404 || !strings.Contains(got, `"not_found"`) {
			t.Errorf("GET %s: %d %q, want 404 not_found", id, status, got)
		}
	}
	if p.Requests() != 4 {
		t.Errorf("GETs counted as charge requests: %d", p.Requests())
	}
}

func TestDifferentBody(t *testing.T) {
	p, c := setup(t)
	ctx, _ := keyed(t, "order-1")
	if _, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500)); err != nil {
		t.Fatal(err)
	}
	for _, body := range []any{
		order("acct_1", 501),
		order("acct_2", 500),
		map[string]any{"account": "acct_1", "amount_cents": 500, "note": "x"},
	} {
		_, err := effectstest.PostCharge(ctx, c, p.URL(), body)
		var se *effectstest.StatusError
		if !errors.As(err, &se) || se.StatusCode != 422 || se.Code != "idempotency_key_reused" || !core.IsPermanent(err) {
			t.Errorf("%v: %v, want a permanent 422 idempotency_key_reused", body, err)
		}
	}
	if got, want := countsOf(p), (counts{charges: 1, requests: 4, mismatches: 3}); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
}

func TestBadRequests(t *testing.T) {
	p, c := setup(t)
	ctx, key := keyed(t, "order-1")

	// No key: the context carries none, or the client has no Transport.
	_, err := effectstest.PostCharge(context.Background(), c, p.URL(), order("acct_1", 500))
	if statusOf(err) != 400 || !core.IsPermanent(err) || !strings.Contains(err.Error(), "idempotency_key_missing") {
		t.Errorf("no key in ctx: %v, want a permanent 400 idempotency_key_missing", err)
	}
	_, err = effectstest.PostCharge(ctx, http.DefaultClient, p.URL(), order("acct_1", 500))
	if statusOf(err) != 400 {
		t.Errorf("client without Transport: %v, want 400", err)
	}

	for _, body := range []string{
		``, `[]`, `null`, `"x"`, `{`, `{} {}`, `{"account": 1}`,
		`{"amount_cents": "500"}`, `{"amount_cents": 5.5}`, `{"amount_cents": 1e3}`,
	} {
		status, _, got := post(t, c, ctx, p.URL(), body)
		if status != 400 || !strings.Contains(got, `"invalid_body"`) {
			t.Errorf("body %q: %d %q, want 400 invalid_body", body, status, got)
		}
	}
	// Rejected requests do not use up the key.
	if ch, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500)); err != nil || ch.ID != "ch_1" {
		t.Fatalf("after bad requests: %+v, %v", ch, err)
	}
	if p.Charges() != 1 || p.ChargesFor(key) != 1 || p.Requests() != 13 {
		t.Errorf("charges %d, for key %d, requests %d", p.Charges(), p.ChargesFor(key), p.Requests())
	}
	// Any JSON object is a charge; account and amount default to "" and 0.
	ctx2, _ := keyed(t, "order-2")
	if ch, err := effectstest.PostCharge(ctx2, c, p.URL(), map[string]any{"what": []int{1}}); err != nil || ch.ID != "ch_2" || ch.Account != "" || ch.AmountCents != 0 {
		t.Errorf("other object: %+v, %v", ch, err)
	}
}

func TestFailNext(t *testing.T) {
	p, c := setup(t)
	ctx, key := keyed(t, "order-1")
	p.FailNext(1, 500)
	_, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500))
	var se *effectstest.StatusError
	if !errors.As(err, &se) || se.StatusCode != 500 || se.Code != "injected_failure" || core.IsPermanent(err) || !se.Retryable() {
		t.Fatalf("failed attempt: %v, want a transient 500 injected_failure", err)
	}
	if p.Charges() != 0 {
		t.Fatalf("the failure charged")
	}
	// The failure did not use up the key: the retry charges.
	ch, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500))
	if err != nil || ch.ID != "ch_1" || p.ChargesFor(key) != 1 {
		t.Fatalf("retry: %+v, %v; ChargesFor %d", ch, err, p.ChargesFor(key))
	}

	// Several failures, other statuses; 429 is transient, 400 not.
	p.FailNext(2, 503)
	for range 2 {
		if _, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500)); statusOf(err) != 503 || core.IsPermanent(err) {
			t.Errorf("%v, want a transient 503", err)
		}
	}
	p.FailNext(1, 429)
	if _, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500)); statusOf(err) != 429 || core.IsPermanent(err) {
		t.Errorf("%v, want a transient 429", err)
	}
	p.FailNext(1, 403)
	if _, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500)); statusOf(err) != 403 || !core.IsPermanent(err) {
		t.Errorf("%v, want a permanent 403", err)
	}
	// FailNext(0, …) cancels what is left.
	p.FailNext(5, 500)
	p.FailNext(0, 500)
	if ch2, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500)); err != nil || ch2 != ch {
		t.Errorf("after cancel: %+v, %v", ch2, err)
	}
	if got, want := countsOf(p), (counts{charges: 1, requests: 7, replays: 1}); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	defer func() {
		if recover() == nil {
			t.Error("FailNext(1, 200) did not panic")
		}
	}()
	p.FailNext(1, 200)
}

// Many requests at once with one key: one charge; the others are 409 (the
// first is in flight) or replays of it.
func TestConcurrentSameKey(t *testing.T) {
	p, c := setup(t)
	p.SetDelay(20 * time.Millisecond)
	ctx, key := keyed(t, "order-1")
	const n = 16
	var wg sync.WaitGroup
	var mu sync.Mutex
	ids := map[string]int{}
	statuses := map[int]int{}
	for range n {
		wg.Go(func() {
			ch, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ids[ch.ID]++
			case statusOf(err) == 409 && !core.IsPermanent(err):
				statuses[409]++
			default:
				t.Errorf("unexpected %v", err)
			}
		})
	}
	wg.Wait()
	if p.Charges() != 1 || p.ChargesFor(key) != 1 || len(ids) != 1 || ids["ch_1"] == 0 {
		t.Fatalf("charges %d, ids %v", p.Charges(), ids)
	}
	if statuses[409] != p.Conflicts() || ids["ch_1"] != 1+p.Replays() || p.Requests() != n {
		t.Errorf("409s %d (Conflicts %d), successes %d (Replays %d), requests %d",
			statuses[409], p.Conflicts(), ids["ch_1"], p.Replays(), p.Requests())
	}
	if p.Conflicts() == 0 {
		t.Log("no 409: every other request came after the first ended")
	}
}

// Many keys at once: a charge each, summed by account.
func TestConcurrentKeys(t *testing.T) {
	p, c := setup(t)
	var wg sync.WaitGroup
	want := map[string]int64{}
	keys := map[string]bool{}
	for i := range 40 {
		ctx, key := keyed(t, "order-"+string(rune('A'+i)))
		acct := []string{"acct_1", "acct_2", "acct_3"}[i%3]
		want[acct] += int64(100 + i)
		keys[key] = true
		wg.Go(func() {
			for range 2 { // a redelivery replays
				if _, err := effectstest.PostCharge(ctx, c, p.URL(), order(acct, int64(100+i))); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	got := p.ChargesByAccount()
	if p.Charges() != 40 || p.Replays() != 40 || len(got) != 3 {
		t.Fatalf("charges %d, replays %d, accounts %v", p.Charges(), p.Replays(), got)
	}
	for a, n := range want {
		if got[a] != n {
			t.Errorf("%s: %d, want %d", a, got[a], n)
		}
	}
	got["acct_1"] = 0 // a copy
	if p.ChargesByAccount()["acct_1"] != want["acct_1"] {
		t.Error("ChargesByAccount returned the provider's map")
	}
	ks := p.Keys()
	for _, k := range ks {
		if !keys[k] {
			t.Errorf("unknown key %q", k)
		}
		delete(keys, k)
	}
	if len(ks) != 40 || len(keys) != 0 {
		t.Errorf("Keys %d, missing %d", len(ks), len(keys))
	}
	// Keys are in charge order: key i made ch_<i+1>.
	req, _ := http.NewRequest(http.MethodGet, p.URL()+"/charges/ch_7", nil)
	if _, _, body := do(t, c, req); !strings.Contains(body, `"key":"`+ks[6]+`"`) {
		t.Errorf("ch_7 is %q, not key %q", body, ks[6])
	}
}

func TestDelay(t *testing.T) {
	p, c := setup(t)
	const d = 150 * time.Millisecond
	p.SetDelay(d)
	ctx, _ := keyed(t, "order-1")
	start := time.Now()
	if _, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500)); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < d {
		t.Errorf("answered after %v, want ≥ %v", el, d)
	}
	// Replays wait too.
	start = time.Now()
	if _, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500)); err != nil || time.Since(start) < d {
		t.Errorf("replay: %v after %v", err, time.Since(start))
	}
	p.SetDelay(0)
	start = time.Now()
	if _, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500)); err != nil || time.Since(start) >= d {
		t.Errorf("SetDelay(0): %v after %v", err, time.Since(start))
	}
}

// retry posts until an answer other than 409, as a consumer retrying a
// message would, for at most 10 s.
func retry(t *testing.T, ctx context.Context, c *http.Client, u string, body any) (effectstest.Charge, error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ch, err := effectstest.PostCharge(ctx, c, u, body)
		if statusOf(err) != 409 || time.Now().After(deadline) {
			return ch, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A client that gives up while the provider is slow: the charge was made
// and the handler ends with the client (the delay is an hour), so the
// retry gets the charge replayed.
func TestDelayClientGivesUp(t *testing.T) {
	p, c := setup(t)
	hook := charged(p)
	p.SetDelay(time.Hour)
	ctx, key := keyed(t, "order-1")
	attempt, giveUp := context.WithCancel(ctx)
	done := goCharge(attempt, c, p.URL(), order("acct_1", 500))
	<-hook // charged when the request arrived
	time.Sleep(20 * time.Millisecond)
	giveUp()
	if r := <-done; !errors.Is(r.err, context.Canceled) || core.IsPermanent(r.err) {
		t.Fatalf("%+v, want a transient context canceled", r)
	}
	if p.ChargesFor(key) != 1 {
		t.Fatal("the charge was not made when the request arrived")
	}
	p.SetDelay(0)
	ch, err := retry(t, ctx, c, p.URL(), order("acct_1", 500))
	if err != nil || ch.ID != "ch_1" {
		t.Fatalf("retry: %+v, %v; want ch_1 replayed", ch, err)
	}
	if p.Charges() != 1 || p.Replays() != 1 {
		t.Errorf("charges %d, replays %d", p.Charges(), p.Replays())
	}
}

// charged returns a channel that gets each charge made, set as p's hook.
func charged(p *effectstest.Provider) <-chan effectstest.Charge {
	ch := make(chan effectstest.Charge, 16)
	p.OnCharge(func(c effectstest.Charge) { ch <- c })
	return ch
}

type result struct {
	ch  effectstest.Charge
	err error
}

func goCharge(ctx context.Context, c *http.Client, u string, body any) <-chan result {
	done := make(chan result, 1)
	go func() {
		ch, err := effectstest.PostCharge(ctx, c, u, body)
		done <- result{ch, err}
	}()
	return done
}

func TestHang(t *testing.T) {
	p, c := setup(t)
	hook := charged(p)
	ctx, key := keyed(t, "order-1")
	p.Hang()
	p.Hang() // twice is once
	done := goCharge(ctx, c, p.URL(), order("acct_1", 500))
	<-hook
	if p.ChargesFor(key) != 1 {
		t.Fatal("not charged while hung")
	}
	// A request that arrives while the first hangs finds its key in use,
	// and hangs too before it answers 409.
	during := goCharge(ctx, c, p.URL(), order("acct_1", 500))
	for p.Conflicts() == 0 {
		time.Sleep(time.Millisecond)
	}
	select {
	case r := <-done:
		t.Fatalf("answered while hung: %+v", r)
	case r := <-during:
		t.Fatalf("answered while hung: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	p.Unhang()
	p.Unhang() // twice is once
	r := <-done
	if r.err != nil || r.ch.ID != "ch_1" {
		t.Fatalf("after Unhang: %+v", r)
	}
	if r := <-during; statusOf(r.err) != 409 {
		t.Errorf("arrived while hung: %+v, want 409", r)
	}
	if ch, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500)); err != nil || ch != r.ch {
		t.Errorf("after Unhang, replay: %+v, %v", ch, err)
	}
	if got, want := countsOf(p), (counts{charges: 1, requests: 3, replays: 1, conflicts: 1}); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
}

// A provider closed while requests hang drops them unanswered: the client
// sees a transient network error, and the charge stands.
func TestCloseWhileHung(t *testing.T) {
	p, c := setup(t)
	hook := charged(p)
	p.Hang()
	ctx, key := keyed(t, "order-1")
	ctx2, _ := keyed(t, "order-2")
	done := goCharge(ctx, c, p.URL(), order("acct_1", 500))
	done2 := goCharge(ctx2, c, p.URL(), order("acct_2", 700))
	<-hook
	<-hook
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	for _, d := range []<-chan result{done, done2} {
		if r := <-d; r.err == nil || statusOf(r.err) != 0 || core.IsPermanent(r.err) {
			t.Errorf("cut off: %+v, want a transient network error", r)
		}
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	if p.ChargesFor(key) != 1 || p.Charges() != 2 || p.ChargesByAccount()["acct_2"] != 700 {
		t.Errorf("charges %d, by account %v", p.Charges(), p.ChargesByAccount())
	}
}

// The hook runs while the charge is in flight, before the answer: here it
// stops the consumer (cancels its request), which then retries and gets
// the charge the hook saw.
func TestOnCharge(t *testing.T) {
	p, c := setup(t)
	ctx, key := keyed(t, "order-1")
	attempt, stop := context.WithCancel(ctx)
	var seen []effectstest.Charge
	gaveUp := make(chan struct{})
	p.OnCharge(func(ch effectstest.Charge) {
		seen = append(seen, ch) // only this request's handler runs it
		if p.Conflicts() == 0 {
			// The key is in use while the hook runs.
			if _, err := effectstest.PostCharge(ctx, c, p.URL(), order("acct_1", 500)); statusOf(err) != 409 {
				t.Errorf("during the hook: %v, want 409", err)
			}
		}
		stop()
		// Answer only after the client gave up, so the answer cannot win
		// the race with the cancellation.
		<-gaveUp
	})
	var err error
	go func() {
		defer close(gaveUp)
		_, err = effectstest.PostCharge(attempt, c, p.URL(), order("acct_1", 500))
	}()
	<-gaveUp
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped attempt: %v, want context canceled", err)
	}
	ch, err := retry(t, ctx, c, p.URL(), order("acct_1", 500))
	want := effectstest.Charge{ID: "ch_1", Account: "acct_1", AmountCents: 500, Key: key}
	if err != nil || ch != want || len(seen) != 1 || seen[0] != want {
		t.Fatalf("retry %+v, %v; hook saw %+v; want %+v", ch, err, seen, want)
	}
	// Replays do not call the hook; nil removes it.
	p.OnCharge(nil)
	ctx2, _ := keyed(t, "order-2")
	if _, err := effectstest.PostCharge(ctx2, c, p.URL(), order("acct_1", 1)); err != nil || len(seen) != 1 {
		t.Errorf("after OnCharge(nil): %v, hook calls %d", err, len(seen))
	}
}

func TestWithHeader(t *testing.T) {
	p := effectstest.NewProvider(effectstest.WithHeader("PayPal-Request-Id"))
	defer p.Close()
	ctx, key := keyed(t, "order-1")
	paypal := &http.Client{Transport: &effects.Transport{Header: "PayPal-Request-Id"}}
	for range 2 {
		if ch, err := effectstest.PostCharge(ctx, paypal, p.URL(), order("acct_1", 500)); err != nil || ch.Key != key {
			t.Fatalf("%+v, %v", ch, err)
		}
	}
	// The default header is not read.
	if _, err := effectstest.PostCharge(ctx, nil, p.URL(), order("acct_1", 500)); statusOf(err) != 400 {
		t.Errorf("Idempotency-Key to a PayPal-Request-Id provider: %v, want 400", err)
	}
	if p.Charges() != 1 || p.Replays() != 1 {
		t.Errorf("charges %d, replays %d", p.Charges(), p.Replays())
	}
}

// PostCharge with a nil client sends the key through effects.Transport;
// answers other than the provider's are classified too.
func TestPostCharge(t *testing.T) {
	p, _ := setup(t)
	ctx, _ := keyed(t, "order-1")
	if ch, err := effectstest.PostCharge(ctx, nil, p.URL()+"/", order("acct_1", 500)); err != nil || ch.ID != "ch_1" {
		t.Fatalf("nil client: %+v, %v", ch, err)
	}
	if _, err := effectstest.PostCharge(ctx, nil, p.URL(), func() {}); !core.IsPermanent(err) {
		t.Errorf("unencodable body: %v, want permanent", err)
	}
	// The provider is gone: a network error, transient.
	p.Close()
	if _, err := effectstest.PostCharge(ctx, nil, p.URL(), order("acct_1", 500)); err == nil || core.IsPermanent(err) {
		t.Errorf("closed provider: %v, want transient", err)
	}
}
