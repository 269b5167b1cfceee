package rabbitmq

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
)

func bufferLogger() (*slog.Logger, *servicetest.Buffer) {
	b := &servicetest.Buffer{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

// publishBadIDHeader publishes one message whose MessageId header is a
// boolean, which the Source warns about when it receives it.
func publishBadIDHeader(t *testing.T, url, queue string) {
	t.Helper()
	ch := testChannel(t, url)
	if err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp.Publishing{Headers: amqp.Table{"MessageId": true}}); err != nil {
		t.Fatal(err)
	}
}

const badIDWarning = "message without a usable id"

// A Source opened by URL with core.WithAdapterLogger logs its warnings
// there, not to slog.Default().
func TestOpenSourceWithAdapterLogger(t *testing.T) {
	url := amqpURL(t)
	queue := uniqueQueue(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, logs := bufferLogger()
	src, err := core.OpenSource(ctx, strings.TrimSuffix(url, "/")+"/?queue="+queue+"&id_header=MessageId", core.WithAdapterLogger(l))
	if err != nil {
		t.Fatal(err)
	}
	// The Consumer's logger must not replace the one given at open.
	r, err := brokertest.NewReceiver(ctx, src, 1, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	publishBadIDHeader(t, url, queue)
	d, err := r.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Ack(ctx)
	if !strings.Contains(logs.String(), badIDWarning) {
		t.Errorf("the adapter logger got %q, want the warning %q", logs.String(), badIDWarning)
	}
}

// Without a logger of its own, the Source logs to the Consumer's
// (core.WithLogger), which the Consumer hands over when it starts it.
func TestConsumerLoggerReachesSource(t *testing.T) {
	url := amqpURL(t)
	queue := uniqueQueue(t, url)
	src, err := Open(context.Background(), url, WithQueue(queue), WithIDHeader("MessageId"))
	if err != nil {
		t.Fatal(err)
	}
	l, logs := bufferLogger()
	publishBadIDHeader(t, url, queue)
	runEffects(t, src, 1, core.WithLogger(l))
	if !strings.Contains(logs.String(), badIDWarning) {
		t.Errorf("the Consumer's logger got %q, want the adapter's warning %q", logs.String(), badIDWarning)
	}
}

// reconnectWaits returns the retry_in of every "reconnect failed" warning
// logged so far, in order.
func reconnectWaits(t *testing.T, logs *servicetest.Buffer) []time.Duration {
	t.Helper()
	var waits []time.Duration
	for _, line := range strings.Split(logs.String(), "\n") {
		var rec struct {
			Msg     string `json:"msg"`
			RetryIn int64  `json:"retry_in"`
		}
		if line == "" || json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "idemq rabbitmq: reconnect failed" {
			continue
		}
		waits = append(waits, time.Duration(rec.RetryIn))
	}
	return waits
}

// While the broker is unreachable the waits between reconnect attempts
// start at WithReconnectBackoff's min, double, and never exceed its max,
// jitter included; a successful reconnect starts them at min again.
func TestReconnectBackoffBoundsAndReset(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	p := newProxy(t, mustHostPort(t, url))
	ctx := context.Background()
	b := &servicetest.Buffer{}
	const lo, hi = 20 * time.Millisecond, 80 * time.Millisecond
	src, err := Open(ctx, proxiedURL(t, url, p), WithQueue(q), WithLogger(slog.New(slog.NewJSONHandler(b, nil))), WithReconnectBackoff(lo, hi))
	if err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, src, 0)
	publishN(t, url, q, "backoff", 1)
	if err := receiveN(t, r, 1, 10*time.Second)[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	p.setDown(true)
	p.cut()
	waitUntil(t, 10*time.Second, func() bool { return len(reconnectWaits(t, b)) >= 5 })
	waits := reconnectWaits(t, b)
	for i, w := range waits {
		if w < lo*8/10 || w > hi {
			t.Errorf("wait %d is %v, outside [%v, %v]", i+1, w, lo*8/10, hi)
		}
	}
	if waits[0] > lo*12/10 || waits[4] < hi*8/10 {
		t.Errorf("waits %v do not start near %v and grow to near %v", waits, lo, hi)
	}
	p.setDown(false)
	waitUntil(t, 10*time.Second, func() bool { return src.Stats().Reconnects == 1 })
	before := len(reconnectWaits(t, b))
	p.setDown(true)
	p.cut()
	waitUntil(t, 10*time.Second, func() bool { return len(reconnectWaits(t, b)) > before })
	if w := reconnectWaits(t, b)[before]; w > lo*12/10 {
		t.Errorf("first wait after a successful reconnect is %v, want about %v (reset)", w, lo)
	}
}
