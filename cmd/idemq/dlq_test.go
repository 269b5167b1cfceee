package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemq/idemq/brokers/brokertest"
	"log/slog"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/sqlite"
)

// The dlq commands on each broker, as an operator runs them after a bad
// deploy: list the parked messages with their causes, show one, redrive one
// back to the queue (refused when parked longer ago than the claims are
// kept), purge the rest.
func TestDLQ(t *testing.T) {
	for _, b := range []struct {
		name string
		urls func(t *testing.T) (source, publisher string)
	}{
		{"RabbitMQ", func(t *testing.T) (string, string) {
			amqp := servicetest.RabbitMQURL(t)
			q := "idemq-dlqcli-" + randomHex(4)
			servicetest.DeleteQueuesAtCleanup(t, amqp, q, q+".dlq")
			return amqp + "?queue=" + q, amqp + "?queue=" + q
		}},
		{"Kafka", func(t *testing.T) (string, string) {
			topic := "idemq-dlqcli-" + randomHex(4)
			bs := servicetest.KafkaTopics(t, 2, topic)
			return fmt.Sprintf("kafka://%s/%s?group=cli-%s", bs, topic, randomHex(3)), fmt.Sprintf("kafka://%s/%s", bs, topic)
		}},
		{"SQS", func(t *testing.T) (string, string) {
			ep := servicetest.SQSEndpoint(t)
			q, dlq := servicetest.SQSQueues(t, ep, "idemq-dlqcli-")
			u := fmt.Sprintf("sqs://test:test@%s?%s", q, url.Values{"endpoint": {ep}, "region": {"us-east-1"}, "dlq": {dlq}}.Encode())
			return u, u
		}},
		{"NATS", func(t *testing.T) (string, string) {
			nu := servicetest.NATSURL(t)
			stream := "DLQCLI_" + strings.ToUpper(randomHex(4))
			servicetest.DeleteStreamsAtCleanup(t, nu, stream, stream+"_DLQ")
			u := nu + "/" + stream + "?consumer=cli&subject=dlqcli." + randomHex(4)
			return u, u
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			src, pub := b.urls(t)
			testDLQCommands(t, src, pub)
		})
	}
}

func testDLQCommands(t *testing.T, sourceURL, publisherURL string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := randomHex(3)
	ids := []string{"pay-" + run + "-1", "pay-" + run + "-2", "pay-" + run + "-3"}
	park(ctx, t, sourceURL, publisherURL, ids)

	var listed []parkedJSON
	waitFor(t, "three parked messages listed", func() bool {
		r := expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL, "--json"})
		listed = nil
		if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil {
			t.Fatalf("list --json: %v\n%s", err, r)
		}
		return len(listed) == len(ids)
	})
	for _, p := range listed {
		if !slices.Contains(ids, p.ID) || !strings.Contains(p.Cause, "bad deploy: "+p.ID) || p.BodyBytes == 0 || p.Destination == "" {
			t.Errorf("listed %+v: want one of %v with its cause, body and destination", p, ids)
		}
	}
	r := expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL}, "3 parked", "bad deploy: "+ids[0], "ATTEMPTS")
	if strings.Contains(r.stdout, "guest:guest") || strings.Contains(r.stdout, "test:test@") {
		t.Errorf("list shows credentials:\n%s", r)
	}
	expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL, "--cause", "bad deploy: " + ids[1]}, "1 parked", ids[1])
	expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL, "--older-than", "1h"}, "0 parked")
	expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL, "--newer-than", "1h"}, "3 parked")
	r = expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL, "--id", ids[0], "--id", ids[2]}, "2 parked", ids[0], ids[2])
	if strings.Contains(r.stdout, ids[1]) {
		t.Errorf("list --id %s --id %s lists %s:\n%s", ids[0], ids[2], ids[1], r)
	}
	expect(t, exitOK, []string{"dlq", "show", "--broker", sourceURL, ids[0]}, "cause:", "bad deploy: "+ids[0], `{"amount":1}`, "app-version: 2.0.1")
	// The same forms everywhere: ids plainly or by --id, the cause in any
	// case, and the console's cause groups.
	expect(t, exitOK, []string{"dlq", "show", "--broker", sourceURL, "--id", ids[0]}, "cause:", "bad deploy: "+ids[0])
	r = expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL, ids[0], ids[2]}, "2 parked", ids[0], ids[2])
	if strings.Contains(r.stdout, ids[1]) {
		t.Errorf("list %s %s lists %s:\n%s", ids[0], ids[2], ids[1], r)
	}
	expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL, "--cause", strings.ToUpper("bad deploy: " + ids[1])}, "1 parked", ids[1])
	expect(t, exitOK, []string{"dlq", "groups", "--broker", sourceURL}, "3 parked", "in 1 cause groups", "bad deploy: …")
	var groups []groupJSON
	r = expect(t, exitOK, []string{"dlq", "groups", "--broker", sourceURL, "--json"})
	if err := json.Unmarshal([]byte(r.stdout), &groups); err != nil || len(groups) != 1 || groups[0].Count != 3 || groups[0].Group != "bad deploy: …" {
		t.Errorf("groups --json: %v %+v\n%s", err, groups, r)
	}
	expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL, "--group", "bad deploy: …", "--newer-than", "1h"}, "3 parked")
	expect(t, exitOK, []string{"dlq", "redrive", "--broker", sourceURL, ids[0], "--retention", "1h", "--dry-run"}, "would redrive 1", ids[0])
	expect(t, exitUsage, []string{"dlq", "purge", "--broker", sourceURL, ids[0]}, "would delete 1")
	// The ref list prints picks one copy, for show and the filters.
	byRef := listed[1]
	expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL}, byRef.Ref)
	r = expect(t, exitOK, []string{"dlq", "show", "--broker", sourceURL, "--ref", byRef.Ref}, "ref:         "+byRef.Ref, "bad deploy: "+byRef.ID)
	if strings.Count(r.stdout, "ref:") != 1 {
		t.Errorf("show --ref %s shows more than its copy:\n%s", byRef.Ref, r)
	}
	expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL, "--ref", byRef.Ref}, "1 parked", byRef.ID)
	expect(t, exitFailure, []string{"dlq", "show", "--broker", sourceURL, "--ref", "no-such-ref"}, "not parked")
	expect(t, exitUsage, []string{"dlq", "show", "--broker", sourceURL, "--ref", byRef.Ref, ids[0]}, "not both")
	expect(t, exitFailure, []string{"dlq", "show", "--broker", sourceURL, "nope-" + run}, "not parked")

	// Redrive needs to know how long claims are kept, and refuses what
	// was parked longer ago than that.
	expect(t, exitUsage, []string{"dlq", "redrive", "--broker", sourceURL, "--id", ids[0]}, "--store URL")
	expect(t, exitFailure, []string{"dlq", "redrive", "--broker", sourceURL, "--id", ids[0], "--retention", "1ms"}, "refused 1", "--force")
	expect(t, exitFailure, []string{"dlq", "redrive", "--broker", sourceURL, "--id", ids[0], "--retention", "1ms", "--dry-run"}, "would refuse 1")
	expect(t, exitOK, []string{"dlq", "redrive", "--broker", sourceURL, "--id", ids[0], "--retention", "1h", "--dry-run"}, "would redrive 1")
	store := "sqlite://" + filepath.Join(t.TempDir(), "claims.db") + "?retention=24h"
	expect(t, exitOK, []string{"migrate", "--store", store})
	r = expect(t, exitOK, []string{"dlq", "redrive", "--broker", sourceURL, "--id", ids[0], "--store", store}, "redrove 1", ids[0])
	if strings.Contains(r.stderr, "redriving") {
		t.Errorf("redrive draws a progress bar on a stderr that is no terminal:\n%s", r)
	}
	back := receiveIDs(ctx, t, sourceURL, 1)
	if !slices.Equal(back, ids[:1]) {
		t.Fatalf("after redrive the queue gave %v, want %v", back, ids[:1])
	}
	expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL}, "2 parked", ids[1], ids[2])
	// --force redrives what the retention would refuse.
	r = expect(t, exitOK, []string{"dlq", "redrive", "--broker", sourceURL, "--id", ids[1], "--retention", "1ms", "--force", "--progress"}, "redrove 1", ids[1])
	if !strings.Contains(r.stderr, "redriving 100%") || !strings.Contains(r.stderr, "(1/1)") {
		t.Errorf("redrive --progress draws no finished bar on stderr:\n%s", r)
	}
	if back := receiveIDs(ctx, t, sourceURL, 1); !slices.Equal(back, ids[1:2]) {
		t.Fatalf("after redrive --force the queue gave %v, want %v", back, ids[1:2])
	}
	expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL}, "1 parked", ids[2])

	expect(t, exitUsage, []string{"dlq", "purge", "--broker", sourceURL, "--all"}, "would delete 1", "--yes")
	expect(t, exitUsage, []string{"dlq", "purge", "--broker", sourceURL, "--yes"}, "--all or a filter")
	expect(t, exitOK, []string{"dlq", "purge", "--broker", sourceURL, "--all", "--yes"}, "purged 1")
	expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL}, "0 parked")
}

// park publishes ids with a body and a header and dead-letters each with
// the cause "bad deploy: <id>".
func park(ctx context.Context, t *testing.T, sourceURL, publisherURL string, ids []string) {
	t.Helper()
	// The source first: it declares the queue the publisher sends to.
	src, err := core.OpenSource(ctx, sourceURL)
	if err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, src, 0)
	defer r.Close()
	p, err := core.OpenPublisher(ctx, publisherURL)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i, id := range ids {
		m := &core.Message{ID: id, Body: fmt.Appendf(nil, `{"amount":%d}`, i+1), Headers: map[string]string{"app-version": "2.0.1"}}
		if err := p.Publish(ctx, "", m); err != nil {
			t.Fatal(err)
		}
	}
	for range ids {
		d, err := r.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.DeadLetter(ctx, errors.New("bad deploy: "+d.Message().ID)); err != nil {
			t.Fatal(err)
		}
	}
}

// receiveIDs receives n messages from the queue, acks them and returns
// their ids.
func receiveIDs(ctx context.Context, t *testing.T, sourceURL string, n int) []string {
	t.Helper()
	src, err := core.OpenSource(ctx, sourceURL)
	if err != nil {
		t.Fatal(err)
	}
	r := brokertest.StartReceiver(t, src, 0)
	defer r.Close()
	var out []string
	for len(out) < n {
		d, err := r.Receive(ctx)
		if err != nil {
			t.Fatalf("after %v: %v", out, err)
		}
		if c, ok := d.Message().Headers["idemq-cause"]; ok {
			t.Errorf("the redriven %s still carries its cause %q", d.Message().ID, c)
		}
		out = append(out, d.Message().ID)
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	servicetest.WaitFor(t, 30*time.Second, what, cond)
}

// A producer that cannot set message_id (amqp-publish, as amqplib or pika
// users often do) sends its id in a MessageId header: the Consumer parks
// the message with a cause that says where it looked and which URL
// parameter reads that header, and the operator reads it by its ref.
func TestDLQMessageWithoutID(t *testing.T) {
	if _, err := exec.LookPath("amqp-publish"); err != nil {
		if servicetest.Required() {
			t.Fatalf("amqp-publish not in PATH (apt-get install amqp-tools), and %s=1 requires it", servicetest.RequireEnv)
		}
		t.Skip("amqp-publish not in PATH (apt-get install amqp-tools)")
	}
	amqp := servicetest.RabbitMQURL(t)
	q := "idemq-noid-" + randomHex(4)
	servicetest.DeleteQueuesAtCleanup(t, amqp, q, q+".dlq")
	sourceURL := amqp + "?queue=" + q
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src, err := core.OpenSource(ctx, sourceURL) // declares the queue
	if err != nil {
		t.Fatal(err)
	}
	// amqp-tools reads the path "/" as the vhost "", amqp091-go as "/".
	out, err := exec.CommandContext(ctx, "amqp-publish", "--url="+strings.TrimSuffix(amqp, "/"), "-r", q,
		"-H", "MessageId: order-7", "-b", `{"order":7}`).CombinedOutput()
	if err != nil {
		t.Fatalf("amqp-publish: %v\n%s", err, out)
	}
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "claims.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var applied atomic.Int64
	c, err := core.New(src, store, func(context.Context, *sql.Tx, *core.Message) error { applied.Add(1); return nil },
		core.WithName("orders"), core.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	waitFor(t, "the message parked", func() bool { return c.Stats().DeadLettered == 1 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if applied.Load() != 0 {
		t.Fatalf("a message without an id was applied %d times", applied.Load())
	}
	var listed []parkedJSON
	r := expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL, "--json"})
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != 1 {
		t.Fatalf("list --json: %v, %d parked\n%s", err, len(listed), r)
	}
	p := listed[0]
	for _, want := range []string{"idemq: message without an id: id: message has no id: rabbitmq: no message_id property", "no message_id property", `header "MessageId"`, "id_header=MessageId"} {
		if !strings.Contains(p.Cause, want) {
			t.Errorf("cause %q lacks %q", p.Cause, want)
		}
	}
	if strings.Count(p.Cause, "idemq:") != 1 {
		t.Errorf("cause %q: want one idemq: prefix", p.Cause)
	}
	expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL}, "(none)", p.Ref)
	expect(t, exitOK, []string{"dlq", "show", "--broker", sourceURL, "--ref", p.Ref}, "id:          (none)", "MessageId: order-7", `{"order":7}`, "id_header=MessageId")

	// The fix the cause names: the consumer reads the header, and the
	// redriven message is applied once, under its id.
	fixed := sourceURL + "&id_header=MessageId"
	expect(t, exitOK, []string{"dlq", "redrive", "--broker", fixed, "--ref", p.Ref, "--retention", "1h"}, "redrove 1")
	src, err = core.OpenSource(ctx, fixed)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var mu sync.Mutex
	c, err = core.New(src, store, func(_ context.Context, _ *sql.Tx, m *core.Message) error {
		mu.Lock()
		got = append(got, m.ID)
		mu.Unlock()
		return nil
	}, core.WithName("orders"), core.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop = context.WithCancel(ctx)
	go func() { done <- c.Run(runCtx) }()
	waitFor(t, "the redriven message applied", func() bool { return c.Stats().Processed == 1 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"order-7"}) {
		t.Errorf("applied %v, want order-7 once", got)
	}
	expect(t, exitOK, []string{"dlq", "list", "--broker", sourceURL}, "0 parked")
}
