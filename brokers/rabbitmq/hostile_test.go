package rabbitmq

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/middleware/tracing"
	"github.com/idemq/idemq/stores/sqlite"
)

// TestHostileMessages publishes raw AMQP messages whose hostile fields the
// broker itself carries (message_id bytes, header tables) and runs them
// through the pipeline into SQLite: odd but valid ids are applied once;
// NUL, invalid UTF-8 and missing ids, eight thousand headers (over a
// limit) are dead-lettered into the dead-letter queue with the cause in
// idemq-cause; non-string and malformed trace headers do not stop a
// message. An id longer than AMQP's 255-byte short string cannot even be
// published. Nothing is lost: the queue ends empty, every message applied
// or parked.
func TestHostileMessages(t *testing.T) {
	url := amqpURL(t)
	queue := uniqueQueue(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, err := Open(ctx, url, WithQueue(queue), WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	// Eight thousand headers in short keys: the header frame must fit the
	// broker's frame_max (128 KiB by default), or RabbitMQ closes the
	// publisher's connection (FRAME_ERROR frame_too_large), and amqp091-go
	// reads at most 8192 entries (TestUnparseableHeadersDeadLetteredByBroker
	// has the ten thousand).
	many := manyHeaders(8000)
	type row struct {
		name    string
		pub     amqp.Publishing
		applied bool
		cause   string
	}
	body := []byte(`{"amount":1}`)
	p := func(id string, h amqp.Table) amqp.Publishing {
		return amqp.Publishing{MessageId: id, Headers: h, Body: body}
	}
	rows := []row{
		{name: "sql metacharacters", pub: p(`x'); DROP TABLE effects; --`, nil), applied: true},
		{name: "255-byte id", pub: p(strings.Repeat("r", 255), nil), applied: true},
		{name: "traceparent as a number", pub: p("tp-int", amqp.Table{"traceparent": int64(42)}), applied: true},
		{name: "traceparent as a nested table", pub: p("tp-table", amqp.Table{"traceparent": amqp.Table{"a": amqp.Table{"b": "c"}}, "tracestate": []any{"x", int32(1)}}), applied: true},
		{name: "malformed traceparent", pub: p("tp-bad", amqp.Table{"traceparent": "00-\x00\xff-zz"}), applied: true},
		{name: "forged attempt header", pub: p("forged-attempt", amqp.Table{driver.AttemptHeader: "not a number", "x-delivery-count": "-5"}), applied: true},
		{name: "empty message_id", pub: p("", nil), cause: "no id"},
		{name: "NUL in message_id", pub: p("a\x00b", nil), cause: "NUL"},
		{name: "invalid UTF-8 message_id", pub: p("a\xff\xfeb", nil), cause: "UTF-8"},
		{name: "eight thousand headers", pub: p("many-headers", many), cause: "8000 headers, at most 1000"},
	}

	// Every row confirmed before the refused publish below: the client may
	// have written part of that one's frames when it refuses it, and the
	// broker then closes the connection, losing a publish not yet routed.
	ch := testChannel(t, url)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(rows)))
	for _, r := range rows {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, r.pub); err != nil {
			t.Fatalf("%s: publish: %v", r.name, err)
		}
	}
	for _, r := range rows {
		if c := <-confirms; !c.Ack {
			t.Fatalf("%s: publish not confirmed", r.name)
		}
	}
	// AMQP cannot carry a longer message_id: the client refuses it.
	if err := testChannel(t, url).PublishWithContext(ctx, "", queue, false, false, p(strings.Repeat("r", 256), nil)); err == nil {
		t.Error("a 256-byte message_id was published; the 1 MiB id rows must then be tested here too")
	} else {
		t.Logf("256-byte message_id refused by the client: %v", err)
	}

	tr, err := tracing.New(tracing.WithTracerProvider(sdktrace.NewTracerProvider()), tracing.WithPropagator(propagation.TraceContext{}), tracing.WithParentFromMessage())
	if err != nil {
		t.Fatal(err)
	}
	applied := runEffects(t, src, len(rows), core.WithObserver(tr), core.WithName("hostile"), core.WithBatchSize(4),
		core.WithLimits(core.Limits{Headers: 1000}))
	dead := map[string][]string{}
	for _, d := range drainQueue(t, url, queue+".dlq") {
		cause, _ := d.Headers[driver.CauseHeader].(string)
		dead[d.MessageId] = append(dead[d.MessageId], cause)
	}
	for _, r := range rows {
		id := r.pub.MessageId
		if r.applied {
			if applied[id] != 1 || len(dead[id]) != 0 {
				t.Errorf("%s: applied %d times, dead-lettered %d; want applied once", r.name, applied[id], len(dead[id]))
			}
			continue
		}
		if applied[id] != 0 || len(dead[id]) != 1 || !strings.Contains(dead[id][0], r.cause) {
			t.Errorf("%s: applied %d, dead letters %q; want one saying %q", r.name, applied[id], dead[id], r.cause)
		}
	}
	if n := queueDepth(t, url, queue); n != 0 {
		t.Errorf("%d messages left in the queue", n)
	}
}

// manyHeaders returns n headers with short keys, so that they fit one
// AMQP frame.
func manyHeaders(n int) amqp.Table {
	t := make(amqp.Table, n)
	for i := range n {
		t[fmt.Sprintf("%x", i)] = int8(1)
	}
	return t
}

// TestUnparseableHeadersDeadLetteredByBroker: a message with ten thousand
// headers is more than amqp091-go will parse (8192 entries); every
// delivery of it drops the consumer's connection before the Consumer sees
// it. On a quorum queue with WithDeliveryLimit the broker dead-letters it
// after the limit; the thirty messages behind it (in the same window) are
// not parked with it, because after a drop the Source consumes one message
// at a time until one parses, then goes back to the full window.
func TestUnparseableHeadersDeadLetteredByBroker(t *testing.T) {
	url := amqpURL(t)
	queue := uniqueQueue(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, err := Open(ctx, strings.TrimSuffix(strings.SplitN(url, "?", 2)[0], "/")+"/?queue="+queue+"&queue_type=quorum&delivery_limit=2",
		WithLogger(testLogger(t)), WithReconnectBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "poison.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE effects (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ch := testChannel(t, url)
	pub := func(id string, h amqp.Table) {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: id, Headers: h, Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	pub("before", nil)
	pub("poison", manyHeaders(10000))
	for i := range 30 {
		pub(fmt.Sprintf("after-%d", i), nil)
	}
	handler := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES (?)`, m.ID)
		return err
	}
	// The default window: after the first drop the Source consumes one
	// message at a time until one parses, so the messages behind the
	// poison are not returned with it on every drop.
	c, err := core.New[*sql.Tx](src, store, handler, core.WithName("poison"), core.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	// The dead letter cannot be read with amqp091-go either: its depth
	// says it is there.
	for deadline := time.Now().Add(30 * time.Second); queueDepth(t, url, queue+".dlq") != 1; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the poison message never reached the dead-letter queue (source stats %+v, consumer %+v, queue depth %d, dlq %d)",
				src.Stats(), c.Stats(), queueDepth(t, url, queue), queueDepth(t, url, queue+".dlq"))
		}
	}
	for deadline := time.Now().Add(30 * time.Second); c.Stats().Processed < 31; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: the messages around the poison were not applied", c.Stats())
		}
	}
	// Back to the full window: one consumer, with the Consumer's window
	// (8 by default) as its prefetch.
	if prefetch, err := consumersOf(queue, "prefetch_count"); err != nil {
		t.Logf("%v (prefetch not checked)", err)
	} else if len(prefetch) != 1 || prefetch[0] != "8" {
		t.Errorf("consumers on the queue after the poison: prefetch %v; want one with 8", prefetch)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := queueDepth(t, url, queue); n != 0 {
		t.Errorf("%d messages left in the queue", n)
	}
	var n int
	if err := store.DB().QueryRowContext(ctx, `SELECT count(DISTINCT id), count(*) FROM effects`).Scan(&n, new(int)); err != nil || n != 31 {
		t.Errorf("effects: %d ids, %v; want the 31 messages around the poison", n, err)
	}
	st := src.Stats()
	if st.Isolations < 1 {
		t.Errorf("stats %+v: no session consumed one message at a time after the drop", st)
	}
	t.Logf("poison dead-lettered by the broker after %d reconnects, %d of them one at a time", st.Reconnects, st.Isolations)
}
