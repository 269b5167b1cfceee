package nats

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// rawJS connects to the server at url with nats.go alone; the connection
// closes when t ends.
func rawJS(t testing.TB, url string, opts ...natsgo.Option) (*natsgo.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := natsgo.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// testStream is a fresh stream name on its own subject; the stream and its
// dead-letter stream are deleted when the test ends.
type testStream struct {
	url, name, subject string
	js                 jetstream.JetStream
}

func newTestStream(t testing.TB, url string, opts ...natsgo.Option) testStream {
	t.Helper()
	id := randomHex(5)
	ts := testStream{url: url, name: "IDEMQ_" + strings.ToUpper(id), subject: "idemq.test." + id}
	_, ts.js = rawJS(t, url, opts...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range []string{ts.name, ts.name + "_DLQ"} {
			if err := ts.js.DeleteStream(ctx, s); err != nil && !strings.Contains(err.Error(), "not found") {
				t.Logf("cleanup: deleting stream %s: %v", s, err)
			}
		}
	})
	return ts
}

// addr is the URL of the test stream's consumer "worker" on its subject.
func (ts testStream) addr() string {
	return ts.url + "/" + ts.name + "?consumer=worker&subject=" + url.QueryEscape(ts.subject)
}

// opts are the options of a test's Source: its logger, then more.
func (ts testStream) opts(t testing.TB, more ...Option) []Option {
	return append([]Option{WithLogger(testLogger(t))}, more...)
}

// publishRaw publishes msgs with nats.go alone, the id in idHeader.
func (ts testStream) publishRaw(ctx context.Context, idHeader string, msgs ...*driver.Message) error {
	for _, m := range msgs {
		h := natsgo.Header{}
		for k, v := range m.Headers {
			h.Set(k, v)
		}
		if m.ID != "" {
			h.Set(idHeader, m.ID)
		}
		if m.Key != "" {
			h.Set(KeyHeader, m.Key)
		}
		if _, err := ts.js.PublishMsg(ctx, &natsgo.Msg{Subject: ts.subject, Header: h, Data: m.Body}); err != nil {
			return err
		}
	}
	return nil
}

// lapsing is a Source whose leases a test lets lapse: its Extend fails
// while refuse is set.
type lapsing struct {
	*Source
	refuse atomic.Bool
}

func (l *lapsing) Extend(ctx context.Context, ms []*driver.Message) error {
	if l.refuse.Load() {
		return errors.New("test: leases left to lapse")
	}
	return l.Source.Extend(ctx, ms)
}

// lapseLeases lets the lease of every message src (a *lapsing) holds
// lapse: no extension is sent from now on, and it returns once the
// AckWait has passed, so every lease (renewed at most by an extension sent
// before now) lapsed, JetStream hands the messages out again and the old
// deliveries are stale. Then extensions go on.
func lapseLeases(t *testing.T, src driver.Source) {
	l := src.(*lapsing)
	l.refuse.Store(true)
	defer l.refuse.Store(false)
	lapsed := time.Now().Add(l.ackWait + 100*time.Millisecond)
	servicetest.WaitFor(t, l.ackWait+10*time.Second, "the AckWait to pass", func() bool { return time.Now().After(lapsed) })
}

// run runs a Consumer of src over e with the tests' logger, then opts.
func run(t *testing.T, e *brokertest.Effects, src driver.Source, h core.Handler[*sql.Tx], opts ...core.Option) (*core.Consumer[*sql.Tx], func() error) {
	return e.Run(t, src, h, append([]core.Option{core.WithLogger(testLogger(t))}, opts...)...)
}
