package pubsub

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/idemq/idemq/brokers/brokertest"
)

// The emulator speaks neither TLS nor credentials, so the test puts a TLS
// endpoint with a certificate of its own in front of it (an HTTP/2 reverse
// proxy) that records the Authorization header of each call. Through
// Open's and NewPublisher's client options, with that certificate
// trusted and a service account's key as credentials, messages flow over
// TLS and every call carries the service account's signed token; without
// the certificate trusted, the Source refuses the endpoint.
func TestTLSAndCredentials(t *testing.T) {
	ts := newTestSub(t, "")
	target, err := url.Parse("http://" + emulatorHost(t))
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	rp.Transport = &http.Transport{Protocols: &h2c}
	var mu sync.Mutex
	var auths []string
	proxy := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		if r.TLS == nil {
			http.Error(w, "not TLS", http.StatusBadRequest)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	proxy.EnableHTTP2 = true
	proxy.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes below
	proxy.StartTLS()
	defer proxy.Close()
	endpoint := strings.TrimPrefix(proxy.URL, "https://")
	t.Setenv("PUBSUB_EMULATOR_HOST", "") // the client then dials endpoints as it would Google's

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	const email = "idemq-test@idemq-test.iam.gserviceaccount.com"
	account, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": project, "private_key_id": "k1", "client_email": email, "client_id": "1",
		"private_key": string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"token_uri":   proxy.URL + "/token", // unused: the client signs its own token
	})
	pool := x509.NewCertPool()
	pool.AddCert(proxy.Certificate())
	opts := []option.ClientOption{option.WithEndpoint(endpoint), option.WithAuthCredentialsJSON(option.ServiceAccount, account),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(credentials.NewClientTLSFromCert(pool, "")))}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, err := NewPublisher(ctx, ts.url(""), opts...)
	if err != nil {
		t.Fatalf("NewPublisher over TLS: %v", err)
	}
	defer pub.Close()
	msgs := messages("tls", 3)
	if err := pub.Publish(ctx, "", msgs...); err != nil {
		t.Fatal(err)
	}
	src, err := Open(ctx, ts.url(""), opts...)
	if err != nil {
		t.Fatalf("Open over TLS: %v", err)
	}
	r := brokertest.StartReceiver(t, src, 10)
	for range msgs {
		d, err := r.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	r.Close()

	mu.Lock()
	defer mu.Unlock()
	if len(auths) < 4 {
		t.Fatalf("%d calls through the TLS endpoint, want the publisher's and the source's", len(auths))
	}
	for _, a := range auths {
		jwt, ok := strings.CutPrefix(a, "Bearer ")
		parts := strings.Split(jwt, ".")
		var claims struct{ Iss string }
		if ok && len(parts) == 3 {
			payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
			json.Unmarshal(payload, &claims)
		}
		if claims.Iss != email {
			t.Fatalf("a call carried Authorization %.40q…, want a token the service account %s signed", a, email)
		}
	}

	// Not trusting the endpoint's certificate, the Source refuses it.
	_, err = Open(ctx, ts.url(""), option.WithEndpoint(endpoint), option.WithAuthCredentialsJSON(option.ServiceAccount, account))
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("Open without the certificate trusted = %v, want a certificate error", err)
	}
}
