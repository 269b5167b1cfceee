package signature_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/brokers/webhook/signature"
)

// handle reads the request's body and verifies it with p, answering as a
// webhook endpoint would.
func handle(p signature.Profile, r *http.Request, now time.Time) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		fmt.Println("read:", err)
		return
	}
	ev, err := p.Verify(r.Header, body, now)
	switch {
	case errors.Is(err, signature.ErrNoID):
		fmt.Println("signed, but no event id: park it")
	case err != nil:
		fmt.Println("refused:", errors.Is(err, signature.ErrBadSignature), errors.Is(err, signature.ErrTimestamp))
	default:
		fmt.Printf("%s event %s\n", p.Name(), ev.ID)
	}
}

// A GitHub delivery, with the vector of GitHub's documentation.
func ExampleGitHub() {
	p, err := signature.GitHub([]string{"It's a Secret to Everybody"})
	if err != nil {
		panic(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/hooks/github", strings.NewReader("Hello, World!"))
	r.Header.Set("X-Hub-Signature-256", "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
	r.Header.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
	handle(p, r, time.Now())
	// Output: github event 72d3162e-cc78-11e3-81ab-4c9367dc0958
}

// A Standard Webhooks (Svix) request, with the vector of the
// specification's reference library, checked first at the time it was
// signed and then an hour later.
func ExampleStandardWebhooks() {
	p, err := signature.StandardWebhooks([]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	if err != nil {
		panic(err)
	}
	request := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/hooks/svix", strings.NewReader(`{"test": 2432232314}`))
		r.Header.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
		r.Header.Set("webhook-timestamp", "1614265330")
		r.Header.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
		return r
	}
	signedAt := time.Unix(1614265330, 0)
	handle(p, request(), signedAt)
	handle(p, request(), signedAt.Add(time.Hour))
	// Output:
	// standard event msg_p5jXN8AQM9LWM0D4loKWxJek
	// refused: false true
}

// A Stripe event during a secret rotation: the endpoint accepts both the
// old and the new signing secret. The header is built here as Stripe
// builds it.
func ExampleStripe() {
	p, err := signature.Stripe([]string{"whsec_old", "whsec_new"}, signature.WithTolerance(3*time.Minute))
	if err != nil {
		panic(err)
	}
	body := `{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"invoice.paid"}`
	now := time.Now()
	t := strconv.FormatInt(now.Unix(), 10)
	mac := hmac.New(sha256.New, []byte("whsec_new"))
	mac.Write([]byte(t + "." + body))

	r := httptest.NewRequest(http.MethodPost, "/hooks/stripe", strings.NewReader(body))
	r.Header.Set("Stripe-Signature", "t="+t+",v1="+hex.EncodeToString(mac.Sum(nil)))
	handle(p, r, now)
	// Output: stripe event evt_1NG8Du2eZvKYlo2CUI79vXWy
}

// A Shopify delivery; X-Shopify-Event-Id is the event id.
func ExampleShopify() {
	p, err := signature.Shopify([]string{"test-webhook-secret"})
	if err != nil {
		panic(err)
	}
	body := `{"id":1234567890,"email":"customer@example.com","total_price":"123.45"}`
	r := httptest.NewRequest(http.MethodPost, "/hooks/shopify", strings.NewReader(body))
	r.Header.Set("X-Shopify-Hmac-SHA256", "QNyObTlKbMx2qDlPF/ZOZcBqg5OgPg+2oky3zldc0Gw=")
	r.Header.Set("X-Shopify-Topic", "orders/create")
	r.Header.Set("X-Shopify-Event-Id", "98880550-7158-44d4-b7cd-2c97c8a091b5")
	handle(p, r, time.Now())

	// The same body signed under another secret is refused.
	r = httptest.NewRequest(http.MethodPost, "/hooks/shopify", strings.NewReader(body))
	r.Header.Set("X-Shopify-Hmac-SHA256", base64.StdEncoding.EncodeToString(make([]byte, 32)))
	handle(p, r, time.Now())
	// Output:
	// shopify event 98880550-7158-44d4-b7cd-2c97c8a091b5
	// refused: true false
}

// Open picks the profile a URL's verify= parameter names.
func ExampleOpen() {
	_, err := signature.Open("svix", []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	fmt.Println(err)
	p, err := signature.Open("standard", []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	fmt.Println(p.Name(), err)
	_, err = signature.Open("standard", []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_%%%"})
	fmt.Println(err)
	// Output:
	// signature: unknown profile "svix" (known: github, shopify, standard, stripe)
	// standard <nil>
	// signature: standard: secret 2 of 2 is not whsec_ followed by a base64 key
}
