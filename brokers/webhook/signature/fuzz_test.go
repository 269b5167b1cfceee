package signature_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/webhook/signature"
)

// The fuzz targets feed arbitrary header values to each parser. Against a
// profile whose secrets the fuzzer cannot know (drawn at random when the
// target starts, never in the corpus) a request must always fail, with an
// error wrapping exactly one sentinel and showing no secret; against a
// profile whose secret signed the seeds, Verify must not panic and its
// errors must keep to the sentinels too.

// randomSecret returns 32 random bytes as raw text and as base64.
func randomSecret(f *testing.F) (raw, b64 string) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		f.Fatal(err)
	}
	return string(b), base64.StdEncoding.EncodeToString(b)
}

// checkUnforgeable fails unless err is a Verify failure as described above.
func checkUnforgeable(t *testing.T, p signature.Profile, ev signature.Event, err error, secrets ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: a fuzzed request verified without the secret: %+v", p.Name(), ev)
	}
	checkSentinel(t, p, err)
	for _, s := range secrets {
		if strings.Contains(err.Error(), s) {
			t.Fatalf("%s: error shows a secret: %v", p.Name(), err)
		}
	}
}

// checkSentinel fails unless err is nil or wraps exactly one sentinel.
func checkSentinel(t *testing.T, p signature.Profile, err error) {
	t.Helper()
	if err == nil {
		return
	}
	n := 0
	for _, s := range sentinels {
		if errors.Is(err, s) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%s: error %v wraps %d sentinels, want 1", p.Name(), err, n)
	}
}

var fuzzNow = time.Unix(swTimestamp, 0)

func FuzzStripeSignature(f *testing.F) {
	raw, _ := randomSecret(f)
	hidden := must(signature.Stripe([]string{raw}))
	known := must(signature.Stripe([]string{stripeSecret}))
	v1 := "t=1614265330,v1=" + stripeVector
	for _, s := range []string{v1, v1 + ",v1=bad_signature", v1 + ",v0=00", "t=1614265330, v1=" + stripeVector, "v1,t=1", "t=", "",
		"t=1614265330,t=1614265330", "t=01614265330,v1=" + stripeVector, strings.Repeat("v1=00,", 20), "t=1614265330,v1=" + strings.ToUpper(stripeVector)} {
		f.Add(s, []byte(stripePayload))
	}
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		h := http.Header{"Stripe-Signature": {header}}
		ev, err := hidden.Verify(h, body, fuzzNow)
		checkUnforgeable(t, hidden, ev, err, raw)
		ev, err = known.Verify(h, body, fuzzNow)
		checkSentinel(t, known, err)
		if err == nil && (ev.ID == "" || !strings.Contains(header, strconv.FormatInt(ev.Timestamp.Unix(), 10))) {
			t.Fatalf("verified with event %+v from header %q", ev, header)
		}
	})
}

func FuzzWebhookSignature(f *testing.F) {
	_, b64 := randomSecret(f)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	hiddenKeys := []string{"whsec_" + b64, "whpk_" + base64.StdEncoding.EncodeToString(pub)}
	hidden := must(signature.StandardWebhooks(hiddenKeys))
	known := must(signature.StandardWebhooks([]string{swSecret, swPublicKey(f)}))
	ts := strconv.Itoa(swTimestamp)
	for _, s := range []string{swV1, swV1a, swV1 + " " + swV1a, swForeign, "v1,", "v1a,", "v1", ",", " ", "v2,abc " + swV1,
		strings.Repeat(swV1+" ", 17), "v1," + strings.TrimRight(swV1[3:], "="), "v1a," + swV1[3:]} {
		f.Add(s, ts, swMsgID, []byte(swPayload))
	}
	f.Add(swV1, "01614265330", swMsgID, []byte(swPayload))
	f.Add(swV1, ts, "", []byte(swPayload))
	f.Fuzz(func(t *testing.T, sig, ts, id string, body []byte) {
		h := http.Header{"Webhook-Signature": {sig}, "Webhook-Timestamp": {ts}, "Webhook-Id": {id}}
		ev, err := hidden.Verify(h, body, fuzzNow)
		checkUnforgeable(t, hidden, ev, err, b64)
		ev, err = known.Verify(h, body, fuzzNow)
		checkSentinel(t, known, err)
		if err == nil && (ev.ID != id || strconv.FormatInt(ev.Timestamp.Unix(), 10) != ts) {
			t.Fatalf("verified with event %+v from id %q, timestamp %q", ev, id, ts)
		}
	})
}

func FuzzGitHubSignature(f *testing.F) {
	raw, _ := randomSecret(f)
	hidden := must(signature.GitHub([]string{raw}))
	known := must(signature.GitHub([]string{"It's a Secret to Everybody"}))
	for _, s := range []string{"sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17", "sha256=", "sha256", "sha1=00", "", "sha256=zz"} {
		f.Add(s, []byte("Hello, World!"))
	}
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		h := http.Header{"X-Hub-Signature-256": {header}, "X-Github-Delivery": {"d-1"}}
		ev, err := hidden.Verify(h, body, fuzzNow)
		checkUnforgeable(t, hidden, ev, err, raw)
		_, err = known.Verify(h, body, fuzzNow)
		checkSentinel(t, known, err)
	})
}

func FuzzShopifyHeaders(f *testing.F) {
	raw, _ := randomSecret(f)
	hidden := must(signature.Shopify([]string{raw}, signature.WithTolerance(time.Hour)))
	known := must(signature.Shopify([]string{"test-webhook-secret"}, signature.WithTolerance(time.Hour)))
	const body = `{"id":1234567890,"email":"customer@example.com","total_price":"123.45"}`
	for _, s := range []string{"2021-02-25T15:02:10Z", "2021-02-25T15:02:10.123456789+01:00", "", "yesterday", "2021-02-25T15:02:10", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59-23:59"} {
		f.Add("QNyObTlKbMx2qDlPF/ZOZcBqg5OgPg+2oky3zldc0Gw=", s, []byte(body))
	}
	f.Add("QNyObTlKbMx2qDlPF/ZOZcBqg5OgPg+2oky3zldc0Gw", "", []byte(body))
	f.Add("!!", "", []byte(body))
	f.Fuzz(func(t *testing.T, hmac, triggeredAt string, body []byte) {
		h := http.Header{"X-Shopify-Hmac-Sha256": {hmac}, "X-Shopify-Triggered-At": {triggeredAt}, "X-Shopify-Event-Id": {"e-1"}}
		ev, err := hidden.Verify(h, body, fuzzNow)
		checkUnforgeable(t, hidden, ev, err, raw)
		ev, err = known.Verify(h, body, fuzzNow)
		checkSentinel(t, known, err)
		if err == nil && triggeredAt != "" && (ev.Timestamp.Sub(fuzzNow) > time.Hour || fuzzNow.Sub(ev.Timestamp) > time.Hour) {
			t.Fatalf("verified with Triggered-At %q outside the tolerance", triggeredAt)
		}
	})
}
