package brokertest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

// testStaleAfterReconnect: deliveries received before the adapter
// reconnected can no longer be settled. Each settlement says so
// (ErrStaleDelivery) and sends nothing: the acked message comes back, the
// dead-lettered one is not parked and comes back too.
func testStaleAfterReconnect(t *testing.T, h Harness) {
	f, msgs, s, ds := h.delivered(t, "stale", 3)
	f.Reconnect(t, s.Source())

	ctx := ctxFor(t, h.ReceiveTimeout)
	settles := []struct {
		what string
		do   func(d *Delivery) error
	}{
		{"Ack", func(d *Delivery) error { return d.Ack(ctx) }},
		{"DeadLetter", func(d *Delivery) error {
			return d.DeadLetter(ctx, errors.New("brokertest: parked after reconnect"))
		}},
		{"AckBatch", func(d *Delivery) error {
			return s.AckBatch(ctx, []*Delivery{d})
		}},
	}
	for i, st := range settles {
		err := st.do(ds[i])
		if !errors.Is(err, driver.ErrStaleDelivery) {
			t.Errorf("%s of %q received before the reconnect: err %v, want one wrapping driver.ErrStaleDelivery", st.what, ds[i].Message().ID, err)
		}
	}
	// Nothing was sent: every message comes back, and none was parked.
	again := receiveExactly(t, h, s, "after stale settlements", msgIDs(msgs))
	ackAll(t, again)
	expectQuiet(t, h, s)
	dls, err := f.DeadLetters(context.Background())
	if err != nil {
		t.Fatalf("DeadLetters: %v", err)
	}
	for _, dl := range dls {
		if dl.ID == ds[1].Message().ID {
			t.Fatalf("%q was dead-lettered by a stale settlement", dl.ID)
		}
	}
}

// testPublisherRoundTrip: the adapter's Publisher puts the id, key,
// headers and W3C trace context where the broker carries them (read with
// the broker's own client), and the adapter's Source reads them back.
func testPublisherRoundTrip(t *testing.T, h Harness) {
	f := h.fixture(t)
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })

	pub := f.NewPublisher(t)
	t.Cleanup(func() { _ = pub.Close() })
	var tid trace.TraceID
	var sid trace.SpanID
	copy(tid[:], randomHex(8))
	copy(sid[:], randomHex(4))
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(ctxFor(t, h.ReceiveTimeout), sc)

	msgs := messages("rt", 2)
	for i, m := range msgs {
		m.Key = "key-" + m.ID
		m.Headers["idemq-test-extra"] = "x" + m.ID
		// One at a time: Raw takes the first, the Source the second.
		if err := pub.Publish(ctx, "", msgs[i]); err != nil {
			t.Fatalf("Publish %q: %v", m.ID, err)
		}
		if i == 0 {
			raw, err := f.Raw(ctx)
			if err != nil {
				t.Fatalf("Raw: %v", err)
			}
			checkLanded(t, h, "on the broker", m, raw.ID, raw.Key, raw.Headers, raw.Body, tid)
		}
	}
	s := receiver(t, f, 0)
	ds := receive(t, h, s, 1)
	got := ds[0].Message()
	checkLanded(t, h, "read back by the Source", msgs[1], got.ID, got.Key, got.Headers, got.Body, tid)
	ackAll(t, ds)
}

func checkLanded(t *testing.T, h Harness, where string, want *driver.Message, id, key string, headers map[string]string, body []byte, tid trace.TraceID) {
	t.Helper()
	if id != want.ID {
		t.Errorf("%s: id %q, want %q", where, id, want.ID)
	}
	if h.CarriesKey && key != want.Key {
		t.Errorf("%s: key %q, want %q", where, key, want.Key)
	}
	if string(body) != string(want.Body) {
		t.Errorf("%s: body %q, want %q", where, body, want.Body)
	}
	for k, v := range want.Headers {
		if headers[k] != v {
			t.Errorf("%s: header %s = %q, want %q (headers %v)", where, k, headers[k], v, headers)
		}
	}
	if tp := headers["traceparent"]; !strings.Contains(tp, tid.String()) {
		t.Errorf("%s: traceparent %q does not carry the publisher's trace %s", where, tp, tid)
	}
}

// testURLUnknownParameter: a URL opener refuses a parameter it does not
// know, naming it, for the Source and the Publisher alike.
func testURLUnknownParameter(t *testing.T, h Harness) {
	f := h.fixture(t)
	const param = "brokertest_no_such_parameter"
	add := func(u string) string {
		if strings.Contains(u, "?") {
			return u + "&" + param + "=1"
		}
		return u + "?" + param + "=1"
	}
	ctx := ctxFor(t, h.ReceiveTimeout)
	// The URLs as given open: the refusal below is about the parameter.
	src, err := core.OpenSource(ctx, f.SourceURL)
	if err != nil {
		t.Fatalf("OpenSource of the fixture's URL: %v", err)
	}
	_ = src.Close()
	pub, err := core.OpenPublisher(ctx, f.PublisherURL)
	if err != nil {
		t.Fatalf("OpenPublisher of the fixture's URL: %v", err)
	}
	_ = pub.Close()

	if src, err := core.OpenSource(ctx, add(f.SourceURL)); err == nil {
		_ = src.Close()
		t.Errorf("OpenSource accepted the unknown parameter %s", param)
	} else if !strings.Contains(err.Error(), param) {
		t.Errorf("OpenSource refused the unknown parameter without naming it: %v", err)
	}
	if pub, err := core.OpenPublisher(ctx, add(f.PublisherURL)); err == nil {
		_ = pub.Close()
		t.Errorf("OpenPublisher accepted the unknown parameter %s", param)
	} else if !strings.Contains(err.Error(), param) {
		t.Errorf("OpenPublisher refused the unknown parameter without naming it: %v", err)
	}
}
