package signature_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/webhook/signature"
)

const (
	secretA = "whsec_" + "c2VjcmV0LWEtc2VjcmV0LWEtc2VjcmV0LWE=" // "secret-a-secret-a-secret-a"
	secretB = "whsec_" + "c2VjcmV0LWItc2VjcmV0LWItc2VjcmV0LWI=" // "secret-b-secret-b-secret-b"
	body    = `{"id":"evt_1","type":"thing.happened"}`
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 500_000_000, time.UTC)

// signed returns, for each timestamped profile, a request signed with
// secret at ts.
var signed = map[string]func(t *testing.T, secret string, ts time.Time) http.Header{
	"standard": func(t *testing.T, secret string, ts time.Time) http.Header {
		return standardHeader("msg_1", ts.Unix(), standardSig(t, secret, "msg_1", ts.Unix(), body))
	},
	"stripe": func(t *testing.T, secret string, ts time.Time) http.Header {
		return stripeHeader(ts.Unix(), stripeV1(secret, ts.Unix(), body))
	},
	"shopify": func(t *testing.T, secret string, ts time.Time) http.Header {
		h := shopifyHeader(secret, body, "evt_1")
		h.Set("X-Shopify-Triggered-At", ts.Format(time.RFC3339Nano))
		return h
	},
}

var wantID = map[string]string{"standard": "msg_1", "stripe": "evt_1", "shopify": "evt_1", "github": "d-1"}

func TestTolerance(t *testing.T) {
	for name, sign := range signed {
		t.Run(name, func(t *testing.T) {
			var opts []signature.Option
			if name == "shopify" {
				opts = append(opts, signature.WithTolerance(signature.DefaultTolerance))
			}
			p := must(signature.Open(name, []string{secretA}, opts...))
			// Timestamps are whole seconds; the edges are inclusive.
			base := now.Truncate(time.Second)
			tol := signature.DefaultTolerance
			for _, c := range []struct {
				name string
				now  time.Time
				ts   time.Time
				err  error
			}{
				{"now", now, base, nil},
				{"at the past edge", base, base.Add(-tol), nil},
				{"at the future edge", base, base.Add(tol), nil},
				{"half a second past the edge", now, base.Add(-tol), signature.ErrTimestamp},
				{"expired", base, base.Add(-tol - time.Second), signature.ErrTimestamp},
				{"future", base, base.Add(tol + time.Second), signature.ErrTimestamp},
				{"a day old", now, base.Add(-24 * time.Hour), signature.ErrTimestamp},
				{"epoch", now, time.Unix(0, 0), signature.ErrTimestamp},
			} {
				h := sign(t, secretA, c.ts)
				if c.err == nil {
					wantOK(t, p, h, body, c.now, wantID[name], c.ts)
				} else {
					err := wantErr(t, p, h, body, c.now, c.err)
					t.Logf("%s: %v", c.name, err)
				}
			}
			wide := must(signature.Open(name, []string{secretA}, signature.WithTolerance(48*time.Hour)))
			wantOK(t, wide, sign(t, secretA, base.Add(-24*time.Hour)), body, now, wantID[name], base.Add(-24*time.Hour))
		})
	}
}

func TestMalformedTimestamps(t *testing.T) {
	sw := must(signature.StandardWebhooks([]string{secretA}))
	st := must(signature.Stripe([]string{stripeSecret}))
	for _, raw := range []string{"", "abc", "-1", "+1772366400", "01772366400", "1772366400.5", "1e9", " 1772366400", "99999999999999999999"} {
		h := standardHeader("msg_1", 0, standardSig(t, secretA, "msg_1", now.Unix(), body))
		h.Set("webhook-timestamp", raw)
		wantErr(t, sw, h, body, now, signature.ErrTimestamp)
		hs := http.Header{}
		hs.Set("Stripe-Signature", "t="+raw+",v1="+stripeV1(stripeSecret, now.Unix(), body))
		wantErr(t, st, hs, body, now, signature.ErrTimestamp)
	}
	hs := http.Header{}
	hs.Set("Stripe-Signature", "v1="+stripeV1(stripeSecret, now.Unix(), body))
	wantErr(t, st, hs, body, now, signature.ErrTimestamp)
	hs.Set("Stripe-Signature", fmt.Sprintf("t=%d,t=%d,v1=%s", now.Unix(), now.Unix(), stripeV1(stripeSecret, now.Unix(), body)))
	wantErr(t, st, hs, body, now, signature.ErrMalformed)

	// Shopify's X-Shopify-Triggered-At is unsigned: a malformed one only
	// matters when WithTolerance asks for the check.
	lax := must(signature.Shopify([]string{"k"}))
	strict := must(signature.Shopify([]string{"k"}, signature.WithTolerance(time.Hour)))
	h := shopifyHeader("k", body, "evt_1")
	h.Set("X-Shopify-Triggered-At", "yesterday")
	wantOK(t, lax, h, body, now, "evt_1", time.Time{})
	wantErr(t, strict, h, body, now, signature.ErrTimestamp)
	h.Del("X-Shopify-Triggered-At")
	wantOK(t, strict, h, body, now, "evt_1", time.Time{})
	h.Set("X-Shopify-Triggered-At", now.Add(-2*time.Hour).Format(time.RFC3339))
	wantOK(t, lax, h, body, now, "evt_1", now.Add(-2*time.Hour).Truncate(time.Second))
	wantErr(t, strict, h, body, now, signature.ErrTimestamp)
}

func TestRotation(t *testing.T) {
	for name, sign := range signed {
		t.Run(name, func(t *testing.T) {
			both := must(signature.Open(name, []string{secretA, secretB}))
			onlyA := must(signature.Open(name, []string{secretA}))
			ts := now.Truncate(time.Second)
			wantOK(t, both, sign(t, secretA, ts), body, now, wantID[name], ts)
			wantOK(t, both, sign(t, secretB, ts), body, now, wantID[name], ts)
			wantErr(t, onlyA, sign(t, secretB, ts), body, now, signature.ErrBadSignature)
		})
	}
	t.Run("github", func(t *testing.T) {
		both := must(signature.GitHub([]string{"old", "new"}))
		wantOK(t, both, githubHeader("old", body, "d-1"), body, now, "d-1", time.Time{})
		wantOK(t, both, githubHeader("new", body, "d-1"), body, now, "d-1", time.Time{})
		wantErr(t, both, githubHeader("other", body, "d-1"), body, now, signature.ErrBadSignature)
	})
	t.Run("standard mixes whsec_ and whpk_", func(t *testing.T) {
		at := time.Unix(swTimestamp, 0)
		p := must(signature.StandardWebhooks([]string{secretA, swPublicKey(t), secretB}))
		wantOK(t, p, standardHeader(swMsgID, swTimestamp, swV1a), swPayload, at, swMsgID, at)
		wantErr(t, p, standardHeader(swMsgID, swTimestamp, swV1), swPayload, at, signature.ErrBadSignature)
	})
}

func TestMultipleSignatures(t *testing.T) {
	ts := now.Unix()
	sw := must(signature.StandardWebhooks([]string{secretB}))
	good := standardSig(t, secretB, "msg_1", ts, body)
	bad := standardSig(t, secretA, "msg_1", ts, body)
	for _, sigs := range []string{
		good + " " + bad,
		bad + " " + good,
		bad + " v2,abc v1a,!!! " + good,
		"  " + bad + "\t" + good + "  ",
	} {
		wantOK(t, sw, standardHeader("msg_1", ts, sigs), body, now, "msg_1", time.Unix(ts, 0))
	}
	wantErr(t, sw, standardHeader("msg_1", ts, bad+" "+bad), body, now, signature.ErrBadSignature)
	wantErr(t, sw, standardHeader("msg_1", ts, "v2,"+good[3:]), body, now, signature.ErrBadSignature)
	wantErr(t, sw, standardHeader("msg_1", ts, good[3:]), body, now, signature.ErrMalformed)
	wantErr(t, sw, standardHeader("msg_1", ts, strings.Repeat(bad+" ", 16)+good), body, now, signature.ErrMalformed)
	wantOK(t, sw, standardHeader("msg_1", ts, strings.Repeat(bad+" ", 15)+good), body, now, "msg_1", time.Unix(ts, 0))

	st := must(signature.Stripe([]string{stripeSecret}))
	v1 := stripeV1(stripeSecret, ts, body)
	other := stripeV1("whsec_other", ts, body)
	wantOK(t, st, stripeHeader(ts, other, v1, other), body, now, "evt_1", time.Unix(ts, 0))
	wantErr(t, st, stripeHeader(ts, other, other), body, now, signature.ErrBadSignature)
	wantErr(t, st, stripeHeader(ts, append(make([]string, 15), v1)...), body, now, signature.ErrMalformed)
	h := stripeHeader(ts, v1)
	h.Set("Stripe-Signature", h.Get("Stripe-Signature")+",,")
	wantErr(t, st, h, body, now, signature.ErrMalformed)
	// Unknown schemes are ignored.
	h.Set("Stripe-Signature", fmt.Sprintf("t=%d,v9=zz,v1=%s,x=", ts, v1))
	wantOK(t, st, h, body, now, "evt_1", time.Unix(ts, 0))
}

// The id is checked after the signature: a forged request without an id
// is a bad signature, a genuine one is ErrNoID.
func TestNoID(t *testing.T) {
	ts := now.Unix()
	sw := must(signature.StandardWebhooks([]string{secretA}))
	wantErr(t, sw, standardHeader("", ts, standardSig(t, secretA, "", ts, body)), body, now, signature.ErrNoID)
	wantErr(t, sw, standardHeader("", ts, standardSig(t, secretB, "", ts, body)), body, now, signature.ErrBadSignature)
	// An expired request without id reports the timestamp.
	old := ts - 3600
	wantErr(t, sw, standardHeader("", old, standardSig(t, secretA, "", old, body)), body, now, signature.ErrTimestamp)

	st := must(signature.Stripe([]string{stripeSecret}))
	for _, b := range []string{`{"object":"event"}`, `{"id":""}`, `{"id":42}`, `{"ID":"evt_1"}`, `["evt_1"]`, `not json`, ``, `{"data":{"id":"evt_1"}}`, `{"id":"evt_1"`} {
		wantErr(t, st, stripeHeader(ts, stripeV1(stripeSecret, ts, b)), b, now, signature.ErrNoID)
		wantErr(t, st, stripeHeader(ts, stripeV1("whsec_other", ts, b)), b, now, signature.ErrBadSignature)
	}
	wantOK(t, st, stripeHeader(ts, stripeV1(stripeSecret, ts, `{"data":{"id":"x"}, "id":"evt_2"}`)), `{"data":{"id":"x"}, "id":"evt_2"}`, now, "evt_2", time.Unix(ts, 0))

	gh := must(signature.GitHub([]string{"k"}))
	wantErr(t, gh, githubHeader("k", body, ""), body, now, signature.ErrNoID)
	wantErr(t, gh, githubHeader("x", body, ""), body, now, signature.ErrBadSignature)

	sh := must(signature.Shopify([]string{"k"}))
	wantErr(t, sh, shopifyHeader("k", body, ""), body, now, signature.ErrNoID)
	wantErr(t, sh, shopifyHeader("x", body, ""), body, now, signature.ErrBadSignature)
	h := shopifyHeader("k", body, "")
	h.Set("X-Shopify-Webhook-Id", "wh-1")
	wantOK(t, sh, h, body, now, "wh-1", time.Time{})
	h.Set("X-Shopify-Event-Id", "ev-1")
	wantOK(t, sh, h, body, now, "ev-1", time.Time{})
}

func TestMissingAndMalformedSignatureHeaders(t *testing.T) {
	gh := must(signature.GitHub([]string{"k"}))
	sh := must(signature.Shopify([]string{"k"}))
	st := must(signature.Stripe([]string{"k"}))
	sw := must(signature.StandardWebhooks([]string{secretA}))
	empty := http.Header{"X-Github-Delivery": {"d-1"}, "Webhook-Id": {"m"}, "Webhook-Timestamp": {strconv.FormatInt(now.Unix(), 10)}}
	for _, p := range []signature.Profile{gh, sh, st, sw} {
		wantErr(t, p, empty, body, now, signature.ErrNoSignature)
	}
	// GitHub's legacy SHA-1 header alone does not count.
	legacy := http.Header{"X-Hub-Signature": {"sha1=0000"}, "X-Github-Delivery": {"d-1"}}
	wantErr(t, gh, legacy, body, now, signature.ErrNoSignature)
	for _, v := range []string{"757107ea", "sha1=757107ea", "sha256=zz", "SHA256=00"} {
		wantErr(t, gh, http.Header{"X-Hub-Signature-256": {v}}, body, now, signature.ErrMalformed)
	}
	wantErr(t, gh, http.Header{"X-Hub-Signature-256": {"sha256=00"}}, body, now, signature.ErrBadSignature)
	for _, v := range []string{"not base64!", "QNyObTlKbMx2qDlPF_ZOZcBqg5OgPg-2oky3zldc0Gw"} {
		wantErr(t, sh, http.Header{"X-Shopify-Hmac-Sha256": {v}}, body, now, signature.ErrMalformed)
	}
	wantErr(t, sh, http.Header{"X-Shopify-Hmac-Sha256": {"AAAA"}}, body, now, signature.ErrBadSignature)
}

// The header names match whatever their case on the wire, as net/http
// canonicalizes them when it reads a request.
func TestHeaderCase(t *testing.T) {
	ts := now.Unix()
	for _, c := range []struct {
		p       signature.Profile
		headers string
		id      string
	}{
		{must(signature.StandardWebhooks([]string{secretA})), fmt.Sprintf("WEBHOOK-ID: msg_1\r\nwebhook-timestamp: %d\r\nWebhook-SIGNATURE: %s\r\n", ts, standardSig(t, secretA, "msg_1", ts, body)), "msg_1"},
		{must(signature.Stripe([]string{"k"})), fmt.Sprintf("stripe-signature: t=%d,v1=%s\r\n", ts, stripeV1("k", ts, body)), "evt_1"},
		{must(signature.GitHub([]string{"k"})), fmt.Sprintf("x-hub-signature-256: %s\r\nx-github-delivery: d-1\r\n", githubHeader("k", body, "").Get("X-Hub-Signature-256")), "d-1"},
		{must(signature.Shopify([]string{"k"})), fmt.Sprintf("X-SHOPIFY-HMAC-SHA256: %s\r\nx-shopify-event-id: e-1\r\n", shopifyHeader("k", body, "").Get("X-Shopify-Hmac-Sha256")), "e-1"},
	} {
		raw := "POST /hook HTTP/1.1\r\nHost: example.com\r\n" + c.headers + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			t.Fatal(err)
		}
		ev, err := c.p.Verify(req.Header, []byte(body), now)
		if err != nil || ev.ID != c.id {
			t.Fatalf("%s: Verify = %+v, %v; want id %q", c.p.Name(), ev, err, c.id)
		}
	}
}

// Verify reads the body it is given, and neither writes to it nor reads
// past its length into spare capacity.
func TestBodyUntouched(t *testing.T) {
	ts := now.Unix()
	buf := make([]byte, len(body), len(body)+8)
	copy(buf, body)
	spare := buf[len(body):cap(buf)]
	copy(spare, "SPARESPA")
	sw := must(signature.StandardWebhooks([]string{secretA}))
	if _, err := sw.Verify(standardHeader("msg_1", ts, standardSig(t, secretA, "msg_1", ts, body)), buf, now); err != nil {
		t.Fatal(err)
	}
	st := must(signature.Stripe([]string{"k"}))
	if _, err := st.Verify(stripeHeader(ts, stripeV1("k", ts, body)), buf, now); err != nil {
		t.Fatal(err)
	}
	if string(buf) != body || string(spare) != "SPARESPA" {
		t.Fatalf("body changed: %q, spare %q", buf, spare)
	}
}

func TestConstruction(t *testing.T) {
	for _, c := range []struct {
		name    string
		make    func() (signature.Profile, error)
		wants   []string
		secrets []string // none of which may appear in the error
	}{
		{"no secret", func() (signature.Profile, error) { return signature.Stripe(nil) }, []string{"stripe", "no secret"}, nil},
		{"empty secret", func() (signature.Profile, error) { return signature.GitHub([]string{"first-secret", ""}) }, []string{"github", "secret 2 of 2", "empty"}, []string{"first-secret"}},
		{"bad base64", func() (signature.Profile, error) {
			return signature.StandardWebhooks([]string{secretA, "whsec_not*base64*secret"})
		}, []string{"standard", "secret 2 of 2", "whsec_"}, []string{"not*base64*secret", "c2VjcmV0LWE"}},
		{"empty whsec", func() (signature.Profile, error) { return signature.StandardWebhooks([]string{"whsec_"}) }, []string{"secret 1 of 1"}, nil},
		{"short whpk", func() (signature.Profile, error) {
			return signature.StandardWebhooks([]string{"whpk_" + base64.StdEncoding.EncodeToString([]byte("short-key"))})
		}, []string{"secret 1 of 1", "ed25519"}, []string{"c2hvcnQta2V5"}},
		{"whsk", func() (signature.Profile, error) { return signature.StandardWebhooks([]string{"whsk_" + swSeed}) }, []string{"secret 1 of 1", "whpk_"}, []string{swSeed}},
		{"no prefix", func() (signature.Profile, error) {
			return signature.StandardWebhooks([]string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
		}, []string{"secret 1 of 1", "prefix"}, []string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}},
		{"zero tolerance", func() (signature.Profile, error) {
			return signature.Stripe([]string{"k"}, signature.WithTolerance(0))
		}, []string{"WithTolerance", "positive"}, nil},
		{"negative tolerance", func() (signature.Profile, error) {
			return signature.StandardWebhooks([]string{secretA}, signature.WithTolerance(-time.Second))
		}, []string{"WithTolerance", "positive"}, nil},
		{"github tolerance", func() (signature.Profile, error) {
			return signature.GitHub([]string{"k"}, signature.WithTolerance(time.Minute))
		}, []string{"WithTolerance", "GitHub sends no timestamp"}, nil},
		{"unknown profile", func() (signature.Profile, error) { return signature.Open("svix", []string{"svix-secret"}) }, []string{`"svix"`, "github, shopify, standard, stripe"}, []string{"svix-secret"}},
	} {
		p, err := c.make()
		if err == nil || p != nil {
			t.Fatalf("%s: got %v, %v; want an error", c.name, p, err)
		}
		for _, w := range c.wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", c.name, err, w)
			}
		}
		for _, s := range c.secrets {
			if strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q shows a secret", c.name, err)
			}
		}
	}
	for _, name := range []string{"standard", "stripe", "github", "shopify"} {
		secret := "k"
		if name == "standard" {
			secret = secretA
		}
		if p := must(signature.Open(name, []string{secret})); p.Name() != name {
			t.Errorf("Open(%q).Name() = %q", name, p.Name())
		}
	}
	// A whsec_ secret is used as raw bytes by the other profiles.
	must(signature.Stripe([]string{"whsec_not*base64*secret"}))
}

// No error shows a secret or a signature, whatever the failure.
func TestErrorsHideSecretsAndSignatures(t *testing.T) {
	ts := now.Unix()
	old := ts - 7200
	sigA := standardSig(t, secretA, "msg_1", ts, body)
	sigOld := standardSig(t, secretA, "msg_1", old, body)
	v1 := stripeV1("whsec_k", ts, body)
	sw := must(signature.StandardWebhooks([]string{secretA}))
	swB := must(signature.StandardWebhooks([]string{secretB}))
	st := must(signature.Stripe([]string{"whsec_k"}))
	stB := must(signature.Stripe([]string{"whsec_other"}))
	cases := []struct {
		p    signature.Profile
		h    http.Header
		body string
		hide []string
	}{
		{swB, standardHeader("msg_1", ts, sigA), body, []string{sigA[3:], secretB[6:]}},
		{sw, standardHeader("msg_1", old, sigOld), body, []string{sigOld[3:], secretA[6:]}},
		{sw, standardHeader("", ts, standardSig(t, secretA, "", ts, body)), body, []string{secretA[6:]}},
		{stB, stripeHeader(ts, v1), body, []string{v1, "whsec_other"}},
		{st, stripeHeader(old, stripeV1("whsec_k", old, body)), body, []string{stripeV1("whsec_k", old, body), "whsec_k"}},
		{st, stripeHeader(ts, stripeV1("whsec_k", ts, "{}")), "{}", []string{stripeV1("whsec_k", ts, "{}"), "whsec_k"}},
		{must(signature.GitHub([]string{"gh-secret"})), githubHeader("x", body, "d"), body, []string{"gh-secret", githubHeader("x", body, "d").Get("X-Hub-Signature-256")[7:]}},
		{must(signature.Shopify([]string{"sh-secret"})), shopifyHeader("x", body, "e"), body, []string{"sh-secret", shopifyHeader("x", body, "e").Get("X-Shopify-Hmac-Sha256")}},
	}
	for i, c := range cases {
		_, err := c.p.Verify(c.h, []byte(c.body), now)
		if err == nil {
			t.Fatalf("case %d: no error", i)
		}
		for _, s := range c.hide {
			if strings.Contains(err.Error(), s) {
				t.Errorf("case %d: error %q shows %q", i, err, s)
			}
		}
		if !strings.HasPrefix(err.Error(), "signature: "+c.p.Name()+": ") {
			t.Errorf("case %d: error %q does not name the profile", i, err)
		}
	}
}

func TestErrorsNameTheHeader(t *testing.T) {
	st := must(signature.Stripe([]string{"k"}))
	_, err := st.Verify(stripeHeader(now.Unix(), "00"), []byte(body), now)
	if !errors.Is(err, signature.ErrBadSignature) || !strings.Contains(err.Error(), "Stripe-Signature") {
		t.Fatalf("error %v", err)
	}
	sw := must(signature.StandardWebhooks([]string{secretA}))
	h := standardHeader("m", now.Unix(), "v1,AAAA")
	h.Del("Webhook-Timestamp")
	if _, err := sw.Verify(h, nil, now); !bytes.Contains([]byte(err.Error()), []byte("Webhook-Timestamp")) {
		t.Fatalf("error %v", err)
	}
}
