package signature_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/webhook/signature"
)

// The Standard Webhooks vectors come from the specification's reference
// library: github.com/standard-webhooks/standard-webhooks,
// libraries/go/webhook_symmetric_test.go (TestSymmetricWebhookSign,
// TestSymmetricWebhook) and libraries/go/webhook_asymmetric_test.go
// (TestAsymmetricWebhookSign). Svix's libraries use the same v1 vector.
const (
	swSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	swMsgID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	swTimestamp = 1614265330
	swPayload   = `{"test": 2432232314}`
	swV1        = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	// swSeed is the ed25519 seed (base64) of TestAsymmetricWebhookSign,
	// which signs the same message as swV1 into swV1a.
	swSeed = "VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk="
	swV1a  = "v1a,tQ9V2XOqn7jL/DQenEFpqIugdBVtiMmER5mhSkXBNwM0mkATuDe6KYYUuxqtaiHeYGb7KaaBRdM5WqyeFiL8Ag=="
	// swForeign is the "invalid signature" of TestSymmetricWebhook.
	swForeign = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
)

// swPublicKey returns "whpk_" and the public key of swSeed.
func swPublicKey(t testing.TB) string {
	seed, err := base64.StdEncoding.DecodeString(swSeed)
	if err != nil {
		t.Fatal(err)
	}
	pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	return "whpk_" + base64.StdEncoding.EncodeToString(pub)
}

func TestStandardWebhooksPublishedVectors(t *testing.T) {
	at := time.Unix(swTimestamp, 0)
	sym := must(signature.StandardWebhooks([]string{swSecret}))
	asym := must(signature.StandardWebhooks([]string{swPublicKey(t)}))
	both := must(signature.StandardWebhooks([]string{swPublicKey(t), swSecret}))

	wantOK(t, sym, standardHeader(swMsgID, swTimestamp, swV1), swPayload, at, swMsgID, at)
	wantOK(t, asym, standardHeader(swMsgID, swTimestamp, swV1a), swPayload, at, swMsgID, at)
	wantOK(t, both, standardHeader(swMsgID, swTimestamp, swV1+" "+swV1a), swPayload, at, swMsgID, at)
	// The spec's example header carries both kinds; each verifies alone.
	wantOK(t, sym, standardHeader(swMsgID, swTimestamp, swV1a+" "+swV1), swPayload, at, swMsgID, at)
	wantOK(t, asym, standardHeader(swMsgID, swTimestamp, swV1+" "+swV1a), swPayload, at, swMsgID, at)

	// The library's TestSymmetricWebhook cases.
	wantErr(t, sym, standardHeader(swMsgID, swTimestamp, swForeign), swPayload, at, signature.ErrBadSignature)
	wantErr(t, sym, standardHeader(swMsgID, swTimestamp, "v1,"), swPayload, at, signature.ErrBadSignature)
	wantErr(t, asym, standardHeader(swMsgID, swTimestamp, "v1a,"), swPayload, at, signature.ErrBadSignature)
	wantErr(t, asym, standardHeader(swMsgID, swTimestamp, "v1a,"+strings.TrimPrefix(swForeign, "v1,")), swPayload, at, signature.ErrBadSignature)
	multi := strings.Join([]string{swForeign, "v2," + swForeign[3:], swV1, swForeign}, " ")
	wantOK(t, sym, standardHeader(swMsgID, swTimestamp, multi), swPayload, at, swMsgID, at)

	h := standardHeader(swMsgID, swTimestamp, swV1)
	h.Del("webhook-timestamp")
	wantErr(t, sym, h, swPayload, at, signature.ErrTimestamp)
	h = standardHeader(swMsgID, swTimestamp, swV1)
	h.Del("webhook-signature")
	wantErr(t, sym, h, swPayload, at, signature.ErrNoSignature)
	// Missing id: the signed content changes ("" instead of the id), so
	// the published signature no longer verifies.
	h = standardHeader(swMsgID, swTimestamp, swV1)
	h.Del("webhook-id")
	wantErr(t, sym, h, swPayload, at, signature.ErrBadSignature)
	// Any change to the id, the timestamp or the body breaks the signature.
	wantErr(t, sym, standardHeader(swMsgID+"x", swTimestamp, swV1), swPayload, at, signature.ErrBadSignature)
	wantErr(t, sym, standardHeader(swMsgID, swTimestamp+1, swV1), swPayload, at, signature.ErrBadSignature)
	wantErr(t, sym, standardHeader(swMsgID, swTimestamp, swV1), swPayload+" ", at, signature.ErrBadSignature)
	wantErr(t, asym, standardHeader(swMsgID, swTimestamp, swV1a), swPayload+" ", at, signature.ErrBadSignature)
	// "old timestamp fails" / "new timestamp fails": the published vector
	// checked five minutes and a second away from its timestamp.
	wantErr(t, sym, standardHeader(swMsgID, swTimestamp, swV1), swPayload, at.Add(5*time.Minute+time.Second), signature.ErrTimestamp)
	wantErr(t, sym, standardHeader(swMsgID, swTimestamp, swV1), swPayload, at.Add(-5*time.Minute-time.Second), signature.ErrTimestamp)
}

// stripe-go's webhook/client_test.go (github.com/stripe/stripe-go) signs
// its fixtures at test time with the secret "whsec_test_secret" and an
// event whose id is "evt_test_webhook"; Stripe publishes no fixed
// signature. stripeVector is this payload signed at swTimestamp, computed
// independently of this package with
//
//	printf '%s' '1614265330.{"id":"evt_test_webhook","object":"event"}' |
//	    openssl dgst -sha256 -hmac whsec_test_secret -hex
const (
	stripeSecret  = "whsec_test_secret"
	stripePayload = `{"id":"evt_test_webhook","object":"event"}`
	stripeVector  = "3c5817089d739023dd6190f70a3757e04f7a2fd8b5dab12c2e000f51970dccff"
)

func TestStripeVectors(t *testing.T) {
	at := time.Unix(swTimestamp, 0)
	p := must(signature.Stripe([]string{stripeSecret}))
	hdr := func(v string) http.Header {
		h := http.Header{}
		h.Set("Stripe-Signature", v)
		return h
	}
	valid := "t=1614265330,v1=" + stripeVector
	wantOK(t, p, hdr(valid), stripePayload, at, "evt_test_webhook", at)
	// The secret is used as its bytes, "whsec_" included: decoding it (as
	// Standard Webhooks does) would not verify.
	if got := stripeV1(stripeSecret, swTimestamp, stripePayload); got != stripeVector {
		t.Fatalf("test signer = %s, want the openssl value %s", got, stripeVector)
	}

	// The cases of stripe-go's TestTokenNew.
	wantErr(t, p, hdr(""), stripePayload, at, signature.ErrNoSignature)
	wantErr(t, p, hdr("v1,t=1"), stripePayload, at, signature.ErrMalformed)
	// stripe-go calls "t=" an invalid header; here it is a bad timestamp.
	wantErr(t, p, hdr("t="), stripePayload, at, signature.ErrTimestamp)
	// An unreadable v1 is ignored when another one verifies.
	wantOK(t, p, hdr(valid+",v1=bad_signature"), stripePayload, at, "evt_test_webhook", at)
	// A v0 signature alone does not count.
	wantErr(t, p, hdr("t=1614265330,v0="+stripeVector), stripePayload, at, signature.ErrBadSignature)
	wantErr(t, p, hdr("t=1614265330,v1="+"6465616462656566"), stripePayload, at, signature.ErrBadSignature)
	// Rolled secret: the header carries signatures under the old and the
	// new secret; a profile holding either verifies.
	rolled := valid + ",v1=" + stripeV1(stripeSecret+"_rolled_key", swTimestamp, stripePayload)
	wantOK(t, p, hdr(rolled), stripePayload, at, "evt_test_webhook", at)
	wantOK(t, must(signature.Stripe([]string{stripeSecret + "_rolled_key"})), hdr(rolled), stripePayload, at, "evt_test_webhook", at)
	// 15 s old: refused with a 10 s tolerance, accepted with 20 s.
	p10 := must(signature.Stripe([]string{stripeSecret}, signature.WithTolerance(10*time.Second)))
	p20 := must(signature.Stripe([]string{stripeSecret}, signature.WithTolerance(20*time.Second)))
	wantErr(t, p10, hdr(valid), stripePayload, at.Add(15*time.Second), signature.ErrTimestamp)
	wantOK(t, p20, hdr(valid), stripePayload, at.Add(15*time.Second), "evt_test_webhook", at)
	// The default tolerance is five minutes (stripe-go's DefaultTolerance).
	wantOK(t, p, hdr(valid), stripePayload, at.Add(5*time.Minute), "evt_test_webhook", at)
	wantErr(t, p, hdr(valid), stripePayload, at.Add(5*time.Minute+time.Second), signature.ErrTimestamp)
	// The docs' example header lists v1 and v0 (and may wrap lines).
	wantOK(t, p, hdr("t=1614265330, v1="+stripeVector+", v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39"), stripePayload, at, "evt_test_webhook", at)
}

// GitHub's documentation (docs.github.com, "Validating webhook
// deliveries", "Testing the webhook payload validation") gives this
// vector.
func TestGitHubPublishedVector(t *testing.T) {
	p := must(signature.GitHub([]string{"It's a Secret to Everybody"}))
	h := http.Header{}
	h.Set("X-Hub-Signature-256", "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
	h.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
	wantOK(t, p, h, "Hello, World!", time.Time{}, "72d3162e-cc78-11e3-81ab-4c9367dc0958", time.Time{})
	wantErr(t, p, h, "Hello, World?", time.Time{}, signature.ErrBadSignature)
	wantErr(t, must(signature.GitHub([]string{"It's a Secret to Everybody!"})), h, "Hello, World!", time.Time{}, signature.ErrBadSignature)
}

// Shopify publishes no fixed vector; this one was computed independently
// of this package with
//
//	printf '%s' "$body" | openssl dgst -sha256 -hmac test-webhook-secret -binary | base64
func TestShopifyVector(t *testing.T) {
	const body = `{"id":1234567890,"email":"customer@example.com","total_price":"123.45"}`
	p := must(signature.Shopify([]string{"test-webhook-secret"}))
	h := http.Header{}
	h.Set("X-Shopify-Hmac-SHA256", "QNyObTlKbMx2qDlPF/ZOZcBqg5OgPg+2oky3zldc0Gw=")
	h.Set("X-Shopify-Event-Id", "98880550-7158-44d4-b7cd-2c97c8a091b5")
	h.Set("X-Shopify-Webhook-Id", "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043")
	h.Set("X-Shopify-Triggered-At", "2023-03-29T18:00:27.877041743Z")
	triggered := time.Date(2023, 3, 29, 18, 0, 27, 877041743, time.UTC)
	wantOK(t, p, h, body, time.Time{}, "98880550-7158-44d4-b7cd-2c97c8a091b5", triggered)
	wantErr(t, p, h, body+" ", time.Time{}, signature.ErrBadSignature)
}
