package tracing_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemq/idemq/brokers/webhook"
	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/tracing"
	"github.com/idemq/idemq/stores/sqlite"
)

// A webhook delivery's process span carries what the webhook source tells
// of it (the HTTP method, path and client, the signature profile), not
// only the messaging.* details of the brokers.
func TestWebhookDetailsReachTheSpan(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())

	key := []byte("a Standard Webhooks signing key!!")
	profile, err := signature.StandardWebhooks([]string{"whsec_" + base64.StdEncoding.EncodeToString(key)})
	if err != nil {
		t.Fatal(err)
	}
	src, err := webhook.NewSource(webhook.WithProfile(profile), webhook.WithParkDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	tr, err := tracing.New(tracing.WithTracerProvider(tp), tracing.WithPropagator(prop))
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New(src, store, func(context.Context, *sql.Tx, *core.Message) error { return nil },
		core.WithObserver(tr), core.WithName("hooks"), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	mux := http.NewServeMux()
	mux.Handle("POST /hooks/orders", src)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	body := `{"type":"order.paid"}`
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	m := hmac.New(sha256.New, key)
	m.Write([]byte("msg_1." + ts + "." + body))
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/hooks/orders", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(signature.HeaderWebhookID, "msg_1")
	req.Header.Set(signature.HeaderWebhookTimestamp, ts)
	req.Header.Set(signature.HeaderWebhookSignature, "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("delivery answered %d", res.StatusCode)
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}

	var span *tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "process /hooks/orders" {
			span = &s
		}
	}
	if span == nil {
		t.Fatalf("no process span among %d", len(exp.GetSpans()))
	}
	got := map[attribute.Key]string{}
	for _, a := range span.Attributes {
		got[a.Key] = a.Value.Emit()
	}
	for k, want := range map[attribute.Key]string{
		"messaging.system":              "webhook",
		"messaging.message.id":          "msg_1",
		"http.request.method":           "POST",
		"url.path":                      "/hooks/orders",
		"client.address":                "127.0.0.1",
		"webhook.profile":               "standard",
		tracing.DecisionKey:             "processed",
		"messaging.consumer.group.name": "hooks",
	} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q (attributes %v)", k, got[k], want, got)
		}
	}
}
