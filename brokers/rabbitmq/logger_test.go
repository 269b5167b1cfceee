package rabbitmq

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/core"
)

// logBuffer is a logger's output, safe to read while the logger writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func bufferLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
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
	defer src.Close()
	// The Consumer's logger must not replace the one given at open.
	src.(*Source).SetLogger(testLogger(t))
	publishBadIDHeader(t, url, queue)
	d, err := src.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Ack(ctx)
	if !strings.Contains(logs.String(), badIDWarning) {
		t.Errorf("the adapter logger got %q, want the warning %q", logs.String(), badIDWarning)
	}
}

// Without a logger of its own, the Source logs to the Consumer's
// (core.WithLogger), which the Consumer hands over with SetLogger.
func TestConsumerLoggerReachesSource(t *testing.T) {
	url := amqpURL(t)
	queue := uniqueQueue(t, url)
	src, err := Open(context.Background(), url, queue, WithIDHeader("MessageId"))
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
