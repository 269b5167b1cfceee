package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/inflight"
	"github.com/idemq/idemq/internal/servicetest"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func openSource(t *testing.T, ts testStream, opts ...Option) *Source {
	t.Helper()
	s, err := Open(context.Background(), ts.addr(), ts.opts(t, opts...)...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// receiver opens a Source on ts and starts it as a Consumer does, with the
// default window.
func receiver(t *testing.T, ts testStream, opts ...Option) (*Source, *brokertest.Receiver) {
	t.Helper()
	s := openSource(t, ts, opts...)
	return s, brokertest.StartReceiver(t, s, 0)
}

func receiveOne(t *testing.T, r *brokertest.Receiver, within time.Duration) *brokertest.Delivery {
	t.Helper()
	d, err := r.Receive(ctxFor(t, within))
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return d
}

func expectNothing(t *testing.T, r *brokertest.Receiver, within time.Duration) {
	t.Helper()
	if d, err := r.Receive(ctxFor(t, within)); err == nil {
		t.Fatalf("unexpected delivery of %q (attempt %d)", d.Message().ID, d.Message().Attempt)
	}
}

// TestNatsMsgID is the default id path as a user meets it: a producer
// publishing with nats.go alone and a Nats-Msg-Id header. JetStream drops
// the producer's retry within the duplicate window; the Source reads the
// id; a dead-lettered message redriven within the window is delivered
// again, with its id, although JetStream has seen that Nats-Msg-Id.
func TestNatsMsgID(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	_, s := receiver(t, ts, WithAckWait(5*time.Second))
	ctx := ctxFor(t, 30*time.Second)
	id := "order-" + randomHex(4)
	for i := range 2 { // the producer retries: JetStream keeps one
		msg := natsgo.NewMsg(ts.subject)
		msg.Header.Set(natsgo.MsgIdHdr, id)
		msg.Header.Set("tenant", "acme")
		msg.Data = []byte(`{"total":42}`)
		ack, err := ts.js.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		if ack.Duplicate != (i == 1) {
			t.Fatalf("publish %d: Duplicate = %v", i, ack.Duplicate)
		}
	}
	d := receiveOne(t, s, 5*time.Second)
	m := d.Message()
	if m.ID != id || m.Attempt != 1 || m.Headers["tenant"] != "acme" || string(m.Body) != `{"total":42}` || m.Source != ts.subject {
		t.Fatalf("received %+v", m)
	}
	expectNothing(t, s, 300*time.Millisecond)
	if err := d.DeadLetter(ctx, errors.New("bad deploy")); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}

	q, err := admin.OpenDeadLetters(ctx, ts.url+"/"+ts.name+"?consumer=worker&subject="+ts.subject)
	if err != nil {
		t.Fatalf("OpenDeadLetters: %v", err)
	}
	defer q.Close()
	var parked []*admin.Parked
	if err := q.Scan(ctx, func(p *admin.Parked) error { parked = append(parked, p); return nil }); err != nil {
		t.Fatalf("Scan: %v", err)
	}
	if len(parked) != 1 || parked[0].ID != id || parked[0].Cause != "bad deploy" || parked[0].Destination != ts.subject || parked[0].Attempt != 1 {
		t.Fatalf("parked %+v", parked)
	}
	if n, err := admin.Redrive(ctx, q, nil, nil); n != 1 || err != nil {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	d = receiveOne(t, s, 5*time.Second)
	m = d.Message()
	if m.ID != id || m.Attempt != 1 || m.Headers["tenant"] != "acme" || m.Headers[driver.CauseHeader] != "" {
		t.Fatalf("redriven %+v", m)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	expectNothing(t, s, 300*time.Millisecond)
	n := 0
	if err := q.Scan(ctx, func(*admin.Parked) error { n++; return nil }); err != nil || n != 0 {
		t.Fatalf("after Redrive: %d parked, %v", n, err)
	}
}

// TestIDHeader reads the id from a header of the producer's choosing, not
// from Nats-Msg-Id: a message published with nats.go alone carries
// different values in the two, and one with Nats-Msg-Id only has no id.
// The Publisher sets the id in both.
func TestIDHeader(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	_, s := receiver(t, ts, WithIDHeader("order-id"))
	ctx := ctxFor(t, 20*time.Second)
	own := func(msgID string, h map[string]string) {
		t.Helper()
		m := &driver.Message{ID: msgID, Headers: h, Body: []byte(msgID)}
		if err := ts.publishRaw(ctx, natsgo.MsgIdHdr, m); err != nil {
			t.Fatal(err)
		}
	}
	own("nats-1", map[string]string{"order-id": "o-1"})
	own("nats-2", nil)
	d := receiveOne(t, s, 5*time.Second)
	if m := d.Message(); m.ID != "o-1" || m.Headers["order-id"] != "o-1" || m.Headers[natsgo.MsgIdHdr] != "nats-1" || driver.MetadataOf(m.Metadata)["messaging.message.id"] != "nats-1" {
		t.Fatalf("received %+v, want the id o-1 from order-id", m)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	d = receiveOne(t, s, 5*time.Second)
	if m := d.Message(); m.ID != "" || m.Headers[natsgo.MsgIdHdr] != "nats-2" {
		t.Fatalf("received %+v, want no id (no order-id header)", m)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}

	p, err := NewPublisher(ctx, ts.addr(), WithIDHeader("order-id"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Publish(ctx, "", &driver.Message{ID: "o-3", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	d = receiveOne(t, s, 5*time.Second)
	if m := d.Message(); m.ID != "o-3" || m.Headers["order-id"] != "o-3" || m.Headers[natsgo.MsgIdHdr] != "o-3" {
		t.Fatalf("received %+v", m)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestHeartbeat: a delivery held three AckWaits is not redelivered while
// the Consumer extends its lease, and its Ack succeeds; past
// WithMaxExtension the lease lapses, JetStream redelivers, and the old
// delivery is stale.
func TestHeartbeat(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	_, s := receiver(t, ts, WithAckWait(600*time.Millisecond), WithMaxExtension(3*time.Second))
	ctx := ctxFor(t, 30*time.Second)
	if err := ts.publishRaw(ctx, natsgo.MsgIdHdr, &driver.Message{ID: "a", Body: []byte("a")}, &driver.Message{ID: "b", Body: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	a, b := receiveOne(t, s, 5*time.Second), receiveOne(t, s, 5*time.Second)
	expectNothing(t, s, 1800*time.Millisecond) // three AckWaits
	if err := a.Ack(ctx); err != nil {
		t.Fatalf("Ack after three AckWaits: %v", err)
	}
	again := receiveOne(t, s, 5*time.Second) // b, past the 3s cap
	if again.Message().ID != b.Message().ID || again.Message().Attempt != 2 {
		t.Fatalf("redelivered %q attempt %d, want %q attempt 2", again.Message().ID, again.Message().Attempt, b.Message().ID)
	}
	// The Consumer names the first reason it found: the lapse at the cap,
	// or the redelivery if it came before the Consumer's next look.
	if err := b.Ack(ctx); !errors.Is(err, core.ErrStaleDelivery) || !errors.Is(err, inflight.ErrLeaseLapsed) && !errors.Is(err, inflight.ErrRedelivered) {
		t.Fatalf("Ack of the lapsed, redelivered delivery = %v, want a stale error saying its lease lapsed or it was redelivered", err)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedeliveryHorizon is the stream's MaxAge plus the dead-letter
// stream's, unbounded without one.
func TestRedeliveryHorizon(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	ctx := ctxFor(t, 20*time.Second)
	s := openSource(t, ts)
	if h, ok := s.RedeliveryHorizon(ctx); !ok || h != driver.Unbounded {
		t.Fatalf("horizon %v %v, want unbounded", h, ok)
	}
	for name, age := range map[string]time.Duration{ts.name: time.Hour, ts.name + "_DLQ": 24 * time.Hour} {
		st, err := ts.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		cfg.MaxAge = age
		if _, err := ts.js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if h, ok := s.RedeliveryHorizon(ctx); !ok || h != 25*time.Hour {
		t.Fatalf("horizon %v %v, want 25h", h, ok)
	}
}

// TestURL: parameters are refused by name, bad values name the parameter,
// and without declare a missing stream, dead-letter stream or consumer is
// named.
func TestURL(t *testing.T) {
	u := servicetest.NATSURL(t)
	ts := newTestStream(t, u)
	ctx := ctxFor(t, 20*time.Second)
	base := u + "/" + ts.name + "?subject=" + ts.subject
	for _, c := range []struct{ url, want string }{
		{base + "&consumer=w&nope=1", `unknown parameter "nope"`},
		{base + "&consumer=w&window=10", `unknown parameter "window"`}, // the Consumer's WithWindow is the window
		{base + "&consumer=w&ack_wait=soon", "parameter ack_wait: not a duration"},
		{base + "&consumer=w&declare=maybe", "parameter declare: not a boolean"},
		{base + "&consumer=a.b", "parameter consumer"},
		{base + "&consumer=w&dlq_subject=x.*", "parameter dlq_subject"},
		{base + "&consumer=w&tls_cert=c.pem", "tls_cert and tls_key go together"},
		{base, "no consumer"},
		{u + "/?consumer=w", "stream as its path"},
		{base + "&consumer=w&declare=false", "the stream " + ts.name + " does not exist"},
	} {
		s, err := core.OpenSource(ctx, c.url)
		if err == nil {
			s.Close()
			t.Errorf("%s opened", c.url)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want it to say %q", c.url, err, c.want)
		}
	}
	if _, err := ts.js.CreateStream(ctx, jetstream.StreamConfig{Name: ts.name, Subjects: []string{ts.subject}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ url, want string }{
		{base + "&consumer=w&declare=false", "the dead-letter stream " + ts.name + "_DLQ does not exist"},
		{base + "&consumer=w&declare=false&dlq_stream=" + ts.name, "the consumer w of stream " + ts.name + " does not exist"},
	} {
		if _, err := core.OpenSource(ctx, c.url); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want it to say %q", c.url, err, c.want)
		}
	}
	p, err := core.OpenPublisher(ctx, base)
	if err != nil {
		t.Fatalf("a publisher needs no consumer: %v", err)
	}
	p.Close()
}

// TestPublishUnconfirmed: a publish JetStream does not ack (no stream on
// the subject) is an error naming the message, and wildcards need a
// destination.
func TestPublishUnconfirmed(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	ctx := ctxFor(t, 20*time.Second)
	p, err := NewPublisher(ctx, ts.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	err = p.Publish(ctx, "idemq.nowhere."+randomHex(4), &driver.Message{ID: "lost-1", Body: []byte("x")})
	if err == nil || !strings.Contains(err.Error(), `"lost-1"`) {
		t.Fatalf("Publish to a subject without a stream = %v", err)
	}
	w, err := NewPublisher(ctx, ts.addr(), WithSubject(ts.subject+".>"), WithDeclare(false))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Publish(ctx, "", &driver.Message{ID: "w"}); err == nil || !strings.Contains(err.Error(), "wildcard") {
		t.Fatalf("Publish to a wildcard = %v", err)
	}
}

// TestWithConnAndLogger: a Source on the caller's connection leaves it
// open at Close; the Consumer's logger (driver.Setup) is used unless the
// Source was given one.
func TestWithConnAndLogger(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	nc, _ := rawJS(t, ts.url)
	ctx := ctxFor(t, 20*time.Second)
	s, err := Open(ctx, ts.addr(), WithConn(nc))
	if err != nil {
		t.Fatal(err)
	}
	mine := testLogger(t)
	if _, err := s.Start(ctx, driver.Setup{Window: 10, Logger: mine}); err != nil {
		t.Fatal(err)
	}
	if s.link.logger() != mine {
		t.Error("the Consumer's logger was ignored without WithLogger")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if nc.IsClosed() {
		t.Fatal("Close closed the caller's connection")
	}
	given := testLogger(t)
	s2 := openSource(t, ts, WithLogger(given))
	if _, err := s2.Start(ctx, driver.Setup{Window: 10, Logger: mine}); err != nil {
		t.Fatal(err)
	}
	if s2.link.logger() != given {
		t.Error("the Consumer's logger replaced the WithLogger logger")
	}
}

// TestCloseUnblocksReceive: a Receive waiting for a message returns
// ErrSourceClosed soon after Close.
func TestCloseUnblocksReceive(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	s := openSource(t, ts)
	if _, err := s.Start(context.Background(), driver.Setup{Window: 10}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := s.Receive(context.Background(), 10)
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, core.ErrSourceClosed) {
			t.Fatalf("Receive = %v, want ErrSourceClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Receive still blocked 5s after Close")
	}
	t.Logf("Close and Receive returned within %v", time.Since(start))
}

// TestHeldNotice: a Source whose consumer has deliveries held
// unacknowledged by another instance says so at its first Receive, with
// their count and the setting that bounds their wait, to the Consumer's
// logger (it was given none of its own).
func TestHeldNotice(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	ctx := ctxFor(t, 20*time.Second)
	_, first := receiver(t, ts)
	if err := ts.publishRaw(ctx, IDHeader, &driver.Message{ID: "h", Body: []byte("h")}); err != nil {
		t.Fatal(err)
	}
	receiveOne(t, first, 5*time.Second) // held, never settled
	s, err := Open(ctx, ts.addr())
	if err != nil {
		t.Fatal(err)
	}
	logs := &servicetest.Buffer{}
	r, err := brokertest.NewReceiver(ctx, s, 10, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	expectNothing(t, r, 300*time.Millisecond)
	if got := logs.String(); !strings.Contains(got, "held unacknowledged") || !strings.Contains(got, "held=1") || !strings.Contains(got, "ack_wait=") {
		t.Fatalf("logged %q, want the held deliveries' notice", got)
	}
}

// TestCloseGivesBack: when a Consumer stops, the message it holds (its
// Release) and those still in the pull buffer (Close) go back to
// JetStream at once, so the next Source gets them in well under the
// AckWait of 30s they would otherwise wait out.
func TestCloseGivesBack(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	ctx := ctxFor(t, 30*time.Second)
	var msgs []*driver.Message
	for i := range 5 {
		msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("g-%d", i), Body: []byte("g")})
	}
	_, r := receiver(t, ts, WithAckWait(30*time.Second))
	if err := ts.publishRaw(ctx, IDHeader, msgs...); err != nil {
		t.Fatal(err)
	}
	receiveOne(t, r, 5*time.Second) // the rest wait in the pull buffer
	closed := time.Now()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	_, again := receiver(t, ts, WithAckWait(30*time.Second))
	seen := map[string]bool{}
	for len(seen) < len(msgs) {
		d := receiveOne(t, again, 10*time.Second)
		seen[d.Message().ID] = true
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("all %d back %v after the close", len(msgs), time.Since(closed).Round(time.Millisecond))
}

// TestRedeliverySupersedes: a message JetStream hands out again while the
// Consumer still holds it under a live lease (here the consumer's AckWait
// was cut on the server after the Source read it) supersedes the held
// delivery by its stream sequence: the held one's Ack is stale and sends
// nothing, and the newer one settles the message.
func TestRedeliverySupersedes(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	ctx := ctxFor(t, 30*time.Second)
	openSource(t, ts, WithAckWait(30*time.Second)) // declares the consumer
	_, r := receiver(t, ts, WithDeclare(false))    // a lease of 30s
	cons, err := ts.js.Consumer(ctx, ts.name, "worker")
	if err != nil {
		t.Fatal(err)
	}
	cfg := cons.CachedInfo().Config
	cfg.AckWait = time.Second
	if _, err := ts.js.UpdateConsumer(ctx, ts.name, cfg); err != nil {
		t.Fatal(err)
	}
	if err := ts.publishRaw(ctx, IDHeader, &driver.Message{ID: "s", Body: []byte("s")}); err != nil {
		t.Fatal(err)
	}
	held := receiveOne(t, r, 5*time.Second)
	again := receiveOne(t, r, 10*time.Second)
	if again.Message().ID != "s" || again.Message().Attempt != 2 {
		t.Fatalf("received %q attempt %d, want s attempt 2", again.Message().ID, again.Message().Attempt)
	}
	if err := held.Ack(ctx); !errors.Is(err, core.ErrStaleDelivery) || !errors.Is(err, inflight.ErrRedelivered) {
		t.Fatalf("Ack of the superseded delivery = %v, want a stale error saying it was redelivered", err)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReceiveBatch: Start makes the Consumer's window the consumer's
// MaxAckPending; Receive returns what the pull buffered, never more than
// asked and without waiting for more after the first; one Ack call
// settles them all.
func TestReceiveBatch(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	ctx := ctxFor(t, 20*time.Second)
	s := openSource(t, ts)
	if _, err := s.Start(ctx, driver.Setup{Window: 10}); err != nil {
		t.Fatal(err)
	}
	if n := s.cons.CachedInfo().Config.MaxAckPending; n != 10 {
		t.Fatalf("MaxAckPending %d, want the window 10", n)
	}
	var msgs []*driver.Message
	for i := range 5 {
		msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("b-%d", i), Body: []byte("b")})
	}
	if err := ts.publishRaw(ctx, IDHeader, msgs...); err != nil {
		t.Fatal(err)
	}
	var got []*driver.Message
	for _, c := range []struct{ max, want int }{{1, 1}, {3, 3}, {10, 1}} {
		ms, err := s.Receive(ctx, c.max)
		if err != nil || len(ms) != c.want {
			t.Fatalf("Receive(%d) = %d messages, %v; want %d", c.max, len(ms), err, c.want)
		}
		got = append(got, ms...)
		if len(got) == 1 {
			servicetest.WaitFor(t, 5*time.Second, "the rest in the pull buffer", func() bool { return len(s.buf) == 4 })
		}
	}
	if err := s.Ack(ctx, got); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	ci, err := s.cons.Info(ctx)
	if err != nil || ci.NumAckPending != 0 || ci.NumPending != 0 {
		t.Fatalf("after the Ack: %+v, %v; want nothing pending", ci, err)
	}
}

// TestHeartbeatOff: with heartbeat=false a held message's lease is never
// extended: JetStream hands it out again after the AckWait, and the held
// delivery is stale.
func TestHeartbeatOff(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	ctx := ctxFor(t, 20*time.Second)
	_, r := receiver(t, ts, WithAckWait(time.Second), WithHeartbeat(false))
	if err := ts.publishRaw(ctx, IDHeader, &driver.Message{ID: "o", Body: []byte("o")}); err != nil {
		t.Fatal(err)
	}
	held := receiveOne(t, r, 5*time.Second)
	again := receiveOne(t, r, 10*time.Second)
	if again.Message().ID != "o" || again.Message().Attempt != 2 {
		t.Fatalf("received %q attempt %d, want o attempt 2", again.Message().ID, again.Message().Attempt)
	}
	if err := held.Ack(ctx); !errors.Is(err, core.ErrStaleDelivery) {
		t.Fatalf("Ack of the lapsed delivery = %v, want a stale error", err)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
