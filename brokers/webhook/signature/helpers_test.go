package signature_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/webhook/signature"
)

// sentinels are the errors every Verify failure wraps exactly one of.
var sentinels = []error{
	signature.ErrNoSignature, signature.ErrMalformed, signature.ErrBadSignature,
	signature.ErrTimestamp, signature.ErrNoID,
}

func hmacSHA256(key string, parts ...string) []byte {
	m := hmac.New(sha256.New, []byte(key))
	for _, p := range parts {
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

// standardSig returns a v1 entry for the Standard Webhooks content under
// whsec, a "whsec_<base64>" secret.
func standardSig(t testing.TB, whsec, id string, ts int64, body string) string {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(whsec[len("whsec_"):])
	if err != nil {
		t.Fatal(err)
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + strconv.FormatInt(ts, 10) + "." + body))
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

func standardHeader(id string, ts int64, sigs string) http.Header {
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	h.Set("webhook-signature", sigs)
	return h
}

func stripeV1(secret string, ts int64, body string) string {
	return hex.EncodeToString(hmacSHA256(secret, strconv.FormatInt(ts, 10), ".", body))
}

func stripeHeader(ts int64, v1s ...string) http.Header {
	v := "t=" + strconv.FormatInt(ts, 10)
	for _, s := range v1s {
		v += ",v1=" + s
	}
	h := http.Header{}
	h.Set("Stripe-Signature", v)
	return h
}

func githubHeader(secret, body, delivery string) http.Header {
	h := http.Header{}
	h.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(hmacSHA256(secret, body)))
	if delivery != "" {
		h.Set("X-GitHub-Delivery", delivery)
	}
	return h
}

func shopifyHeader(secret, body, eventID string) http.Header {
	h := http.Header{}
	h.Set("X-Shopify-Hmac-SHA256", base64.StdEncoding.EncodeToString(hmacSHA256(secret, body)))
	if eventID != "" {
		h.Set("X-Shopify-Event-Id", eventID)
	}
	return h
}

// must returns p, panicking on a construction error.
func must(p signature.Profile, err error) signature.Profile {
	if err != nil {
		panic(err)
	}
	return p
}

// wantOK checks that Verify passes with the event id and timestamp.
func wantOK(t *testing.T, p signature.Profile, h http.Header, body string, now time.Time, id string, ts time.Time) {
	t.Helper()
	ev, err := p.Verify(h, []byte(body), now)
	if err != nil {
		t.Fatalf("%s: Verify: %v", p.Name(), err)
	}
	if ev.ID != id || !ev.Timestamp.Equal(ts) {
		t.Fatalf("%s: Verify = %+v, want ID %q, Timestamp %v", p.Name(), ev, id, ts)
	}
}

// wantErr checks that Verify fails wrapping want, and only want among the
// sentinels.
func wantErr(t *testing.T, p signature.Profile, h http.Header, body string, now time.Time, want error) error {
	t.Helper()
	_, err := p.Verify(h, []byte(body), now)
	if !errors.Is(err, want) {
		t.Fatalf("%s: Verify error = %v, want %v", p.Name(), err, want)
	}
	for _, s := range sentinels {
		if s != want && errors.Is(err, s) {
			t.Fatalf("%s: Verify error %v also wraps %v", p.Name(), err, s)
		}
	}
	return err
}
