package sqs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/inflight"
	"github.com/idemq/idemq/internal/servicetest"
)

// TestConsumerCountsStaleSettlements runs a handler past the heartbeat's
// cap: the message's visibility lapses and SQS hands it out again, so the
// first delivery's Ack is stale. The adapter sends nothing for it (fauxqs,
// like SQS, would accept a delete with the old receipt handle and keep the
// message) and says so: the Consumer counts a stale settlement, not a
// settle error; the copy is decided Duplicate.
func TestConsumerCountsStaleSettlements(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, _ := newQueueWithDLQ(t, ep, false, 1, 0)
	m := msgs("stale", 1)[0]
	publish(t, ep, q, m)
	st := sqliteStore(t)
	s := open(t, ep, q, WithDeadLetterQueue(q.name), WithMaxExtension(time.Second))
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if m.Attempt == 1 {
			// Outlast the visibility: wait until SQS handed the message out again.
			for s.Stats().Received < 2 && ctx.Err() == nil {
				time.Sleep(20 * time.Millisecond)
			}
		}
		return st.apply(ctx, tx, m)
	}
	r := runConsumer(t, s, st.Store, h, core.WithConcurrency(2))
	servicetest.WaitFor(t, 20*time.Second, "a processed and a duplicate decision", func() bool {
		cs := r.c.Stats()
		return cs.Processed == 1 && cs.Duplicates >= 1
	})
	servicetest.WaitFor(t, 10*time.Second, "the stale Ack to be counted", func() bool { return r.c.Stats().Stale >= 1 })
	r.shutdown(t)
	cs := r.c.Stats()
	if cs.SettleErrors != 0 {
		t.Errorf("SettleErrors = %d, want 0: a stale settlement is no failure (stats %+v)", cs.SettleErrors, cs)
	}
	if n := st.count(t, m.ID); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
}

// TestStaleDeliveryErrors settles deliveries that went stale — visibility
// lapsed, receipt handle refused by SQS, Source closed — directly: every
// settlement returns an error wrapping core.ErrStaleDelivery and sends
// nothing, so the messages come back and none is parked.
func TestStaleDeliveryErrors(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, false, 1, 0)
	ms := msgs("stale-direct", 3)
	publish(t, ep, q, ms...)
	s := receiver(t, open(t, ep, q, WithDeadLetterQueue(dlq.name), WithHeartbeat(false)), 3)
	ds := []*brokertest.Delivery{receiveOne(t, s, 10*time.Second), receiveOne(t, s, 10*time.Second), receiveOne(t, s, 10*time.Second)}
	// Another consumer receives them once their visibility lapsed; its
	// window is full, so only a third one can receive them again.
	other := receiver(t, open(t, ep, q, WithDeadLetterQueue(dlq.name), WithVisibilityTimeout(30*time.Second)), 3)
	again := []*brokertest.Delivery{receiveOne(t, other, 10*time.Second), receiveOne(t, other, 10*time.Second), receiveOne(t, other, 10*time.Second)}
	ctx := context.Background()
	settles := map[string]func(d *brokertest.Delivery) error{
		"Ack":        func(d *brokertest.Delivery) error { return d.Ack(ctx) },
		"Retry":      func(d *brokertest.Delivery) error { return d.Retry(ctx, time.Second) },
		"DeadLetter": func(d *brokertest.Delivery) error { return d.DeadLetter(ctx, errors.New("poison")) },
	}
	i := 0
	for what, do := range settles {
		if err := do(ds[i]); !errors.Is(err, core.ErrStaleDelivery) {
			t.Errorf("%s after the visibility lapsed: %v, want an error wrapping core.ErrStaleDelivery", what, err)
		}
		i++
	}
	if n := len(drain(t, ep, dlq.url)); n != 0 {
		t.Errorf("%d messages parked by stale settlements", n)
	}
	if vis, inflight := queueCounts(t, ep, q.url); vis+inflight != 3 {
		t.Errorf("queue holds %d+%d messages, want all 3: a stale settlement deleted one", vis, inflight)
	}

	// SQS refusing the receipt handle (fauxqs answers MessageNotInflight
	// for a handle a later receive replaced) makes a settlement stale too,
	// whatever the Source believed of the visibility.
	d := again[0]
	redo := receiveAfterRelease(t, ep, q, d, WithDeadLetterQueue(dlq.name))
	if err := d.Retry(ctx, 0); !errors.Is(err, core.ErrStaleDelivery) {
		t.Errorf("Retry with a receipt handle SQS refused: %v, want an error wrapping core.ErrStaleDelivery", err)
	}
	if err := redo.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := redo.Ack(ctx); !errors.Is(err, driver.ErrAlreadySettled) {
		t.Errorf("a second Ack: %v, want driver.ErrAlreadySettled", err)
	}

	// After Close nothing is sent either: Close gave the messages back.
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range again[1:] {
		if err := d.Ack(ctx); !errors.Is(err, core.ErrStaleDelivery) || !errors.Is(err, inflight.ErrClosed) {
			t.Errorf("Ack after Close: %v, want an error wrapping core.ErrStaleDelivery and the closed flow's", err)
		}
	}
	if err := again[1].Ack(ctx); !errors.Is(err, core.ErrStaleDelivery) {
		t.Errorf("a second Ack after Close: %v, want it refused as stale too", err)
	}
	// Nor does the closed Source itself.
	if err := other.Source().Ack(ctx, []*driver.Message{again[2].Message()}); !errors.Is(err, core.ErrStaleDelivery) || !errors.Is(err, ErrClosed) {
		t.Errorf("the closed Source's Ack: %v, want an error wrapping core.ErrStaleDelivery and ErrClosed", err)
	}
}

// receiveAfterRelease makes bd's message visible again behind its
// Source's back (with the SDK) and receives it on another Source, replacing
// bd's receipt handle while bd's Consumer still holds it as live: only
// SQS's answer tells bd is stale.
func receiveAfterRelease(t *testing.T, ep string, q testQueue, bd *brokertest.Delivery, opts ...Option) *brokertest.Delivery {
	t.Helper()
	d := bd.Message().AckID.(*delivery)
	_, err := d.src.cl.ChangeMessageVisibility(context.Background(), &awssqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(d.src.q.url), ReceiptHandle: d.raw.ReceiptHandle, VisibilityTimeout: 0,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := receiveOne(t, receiver(t, open(t, ep, q, opts...), 0), 10*time.Second)
	if r.Message().ID != d.msg.ID {
		t.Fatalf("received %q, want %q again", r.Message().ID, d.msg.ID)
	}
	return r
}

// TestDeadLetterKeepsCauseWhenAttributesAreFull parks a message that
// already has SQS's ten attributes: the copy carries the cause where the
// SDK (and the AWS CLI) read it, the attributes that did not fit are folded
// into idemq-attributes, and a Source reading the dead-letter queue gets
// every original attribute back as a header.
func TestDeadLetterKeepsCauseWhenAttributesAreFull(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, false, 5, 0)
	id := "full-" + randomHex(4)
	attrs := map[string]types.MessageAttributeValue{
		DefaultIDAttribute: {DataType: aws.String("String"), StringValue: aws.String(id)},
		"bin":              {DataType: aws.String("Binary"), BinaryValue: []byte{0, 1, 2, 0xff}},
		"amount":           {DataType: aws.String("Number"), StringValue: aws.String("42.5")},
	}
	for i := len(attrs); i < maxAttributes; i++ {
		attrs[fmt.Sprintf("h%d", i)] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(fmt.Sprintf("v%d", i))}
	}
	cl := testClient(ep)
	if _, err := cl.SendMessage(context.Background(), &awssqs.SendMessageInput{
		QueueUrl: aws.String(q.url), MessageBody: aws.String("full body"), MessageAttributes: attrs,
	}); err != nil {
		t.Fatal(err)
	}
	s := open(t, ep, q, WithDeadLetterQueue(dlq.name))
	d := receiveOne(t, receiver(t, s, 0), 10*time.Second)
	want := d.Message().Headers
	if len(want) != maxAttributes {
		t.Fatalf("received %d headers, want %d: %v", len(want), maxAttributes, want)
	}
	if err := d.DeadLetter(context.Background(), core.Permanent(errors.New("bad total"))); err != nil {
		t.Fatal(err)
	}
	if n := s.Stats().DeadLettered; n != 1 {
		t.Errorf("DeadLettered = %d, want 1", n)
	}

	// As the SDK sees the parked copy.
	out, err := cl.ReceiveMessage(context.Background(), &awssqs.ReceiveMessageInput{
		QueueUrl: aws.String(dlq.url), WaitTimeSeconds: 5, MessageAttributeNames: []string{"All"}, VisibilityTimeout: 1,
	})
	if err != nil || len(out.Messages) != 1 {
		t.Fatalf("receive from the DLQ: %d messages, %v", len(out.Messages), err)
	}
	p := out.Messages[0]
	if c := attr(p, driver.CauseHeader); !strings.Contains(c, "bad total") {
		t.Errorf("parked copy's %s = %q, want the cause (attributes %v)", driver.CauseHeader, c, p.MessageAttributes)
	}
	if attr(p, DefaultIDAttribute) != id || attr(p, driver.OriginHeader) != q.name || len(p.MessageAttributes) > maxAttributes {
		t.Errorf("parked copy attributes: %v", p.MessageAttributes)
	}

	// As a Source on the dead-letter queue (a redrive) sees it.
	back := receiveOne(t, receiver(t, open(t, ep, dlq, WithDeadLetterQueue(q.name)), 0), 10*time.Second)
	got := back.Message().Headers
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q after the dead-letter round trip, want %q", k, got[k], v)
		}
	}
	if _, folded := got["idemq-attributes"]; folded {
		t.Error("the folded attribute reached the headers instead of being unfolded")
	}
	if back.Message().ID != id || string(back.Message().Body) != "full body" {
		t.Errorf("round trip: id %q body %q", back.Message().ID, back.Message().Body)
	}
	if err := back.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestURLErrorsNameParameters opens sources by URL with configuration
// problems: each error names the URL parameter the user wrote, never the
// Go option behind it.
func TestURLErrorsNameParameters(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	plain := newQueue(t, ep, "", map[string]string{"VisibilityTimeout": "3"})
	fifo, _ := newQueueWithDLQ(t, ep, true, 3, 0)
	base := func(queue string) string {
		return fmt.Sprintf("sqs://test:test@%s?region=us-east-1&endpoint=%s", queue, url.QueryEscape(ep))
	}
	cases := []struct {
		url   string
		names []string
	}{
		{base(plain.name) + "&dead_letter_mode=redrive", []string{"dead_letter_mode"}},
		{base(plain.name), []string{"dlq", "dead_letter_mode=redrive"}},
		{base(plain.name) + "&dlq=idemq-missing-" + randomHex(4), []string{"dlq"}},
		{base(fifo.name) + "&dlq=" + plain.name, []string{"dlq", "FIFO"}},
		{base(plain.name) + "&dlq=" + plain.name + "&receivers=100", []string{"receivers", "1..64"}},
		{base(plain.name) + "&dlq=" + plain.name + "&wait=1500ms", []string{"wait"}},
		{base(plain.name) + "&dlq=" + plain.name + "&visibility=1500ms", []string{"visibility", "1s..12h"}},
		{base(plain.name) + "&id_attribute=bad%20name", []string{"id_attribute"}},
	}
	for _, c := range cases {
		src, err := core.OpenSource(context.Background(), c.url)
		if err == nil {
			src.Close()
			t.Errorf("%s opened", c.url)
			continue
		}
		for _, n := range c.names {
			if !strings.Contains(err.Error(), n) {
				t.Errorf("%s: %v, want an error naming %s", c.url, err, n)
			}
		}
		if strings.Contains(err.Error(), "With") {
			t.Errorf("%s: %v names a Go option", c.url, err)
		}
	}
	if _, err := core.OpenPublisher(context.Background(), base(plain.name)+"&id_attribute=bad%20name"); err == nil ||
		!strings.Contains(err.Error(), "id_attribute") || strings.Contains(err.Error(), "With") {
		t.Errorf("publisher with a bad id_attribute: %v, want an error naming id_attribute", err)
	}
}

// TestWarningsReachTheGivenLogger makes the receivers fail (the queue is
// deleted under them) and checks where the warning goes: to the logger
// given to core.OpenSource, or else to the Consumer's logger.
func TestWarningsReachTheGivenLogger(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	deleteQueue := func(q testQueue) {
		if _, err := testClient(ep).DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: aws.String(q.url)}); err != nil {
			t.Fatal(err)
		}
	}
	const warning = "idemq sqs: receive failed"

	t.Run("adapter logger by URL", func(t *testing.T) {
		q := newQueue(t, ep, "", nil)
		var buf servicetest.Buffer
		l := slog.New(slog.NewTextHandler(&buf, nil))
		src, err := core.OpenSource(context.Background(),
			fmt.Sprintf("sqs://test:test@%s?region=us-east-1&endpoint=%s&dlq=%s&wait=1s", q.name, url.QueryEscape(ep), q.name),
			core.WithAdapterLogger(l))
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		// The Consumer's logger does not replace the one given by URL.
		r, err := brokertest.NewReceiver(context.Background(), src, 10, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		deleteQueue(q)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := r.Receive(ctx); err == nil {
			t.Fatal("Receive from a deleted queue succeeded")
		}
		servicetest.WaitFor(t, 10*time.Second, "the warning in the adapter logger", func() bool { return strings.Contains(buf.String(), warning) })
	})

	t.Run("consumer logger", func(t *testing.T) {
		q := newQueue(t, ep, "", nil)
		var buf servicetest.Buffer
		l := slog.New(slog.NewTextHandler(&buf, nil))
		s, err := Open(context.Background(), q.addr(), append(clientOpts(ep), WithDeadLetterQueue(q.name), WithWaitTime(time.Second))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		r := runConsumer(t, s, sqliteStore(t).Store, func(context.Context, *sql.Tx, *core.Message) error { return nil }, core.WithLogger(l))
		deleteQueue(q)
		servicetest.WaitFor(t, 10*time.Second, "the warning in the consumer's logger", func() bool { return strings.Contains(buf.String(), warning) })
		r.shutdown(t)
	})
}

// TestRedriveCountsDeadLetteredOnce dead-letters one message through the
// redrive policy on every receive: DeadLettered counts the message once,
// on the receive after which SQS parks it, not each release before.
func TestRedriveCountsDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, false, 5, 3)
	publish(t, ep, q, msgs("redrive-count", 1)...)
	s := open(t, ep, q, WithDeadLetterMode(DeadLetterRedrive))
	r := receiver(t, s, 0)
	for attempt := 1; attempt <= 3; attempt++ {
		d := receiveOne(t, r, 10*time.Second)
		if d.Message().Attempt != attempt {
			t.Fatalf("attempt %d, want %d", d.Message().Attempt, attempt)
		}
		if err := d.DeadLetter(context.Background(), errors.New("poison")); err != nil {
			t.Fatal(err)
		}
	}
	quiet(t, r, 2*time.Second) // the next receive finds it parked, not a fourth delivery
	var parked []types.Message
	servicetest.WaitFor(t, 15*time.Second, "SQS to move the message to the dead-letter queue", func() bool {
		parked = append(parked, drain(t, ep, dlq.url)...)
		return len(parked) == 1
	})
	if n := s.Stats().DeadLettered; n != 1 {
		t.Errorf("DeadLettered = %d for one parked message, want 1", n)
	}
}

// TestStaleDeadLetterParksNoCopy: a delivery whose receipt handle a later
// receive replaced is dead-lettered. SQS would accept the delete with the
// old handle and keep the message, so a copy sent first would be parked
// while the message is decided again; the adapter proves the handle first
// and sends nothing.
func TestStaleDeadLetterParksNoCopy(t *testing.T) {
	t.Parallel()
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, false, 30, 0)
	m := msgs("stale-dl", 1)[0]
	publish(t, ep, q, m)
	d := receiveOne(t, receiver(t, open(t, ep, q, WithDeadLetterQueue(dlq.name), WithHeartbeat(false)), 1), 10*time.Second)
	redo := receiveAfterRelease(t, ep, q, d, WithDeadLetterQueue(dlq.name))
	if err := d.DeadLetter(context.Background(), errors.New("poison")); !errors.Is(err, core.ErrStaleDelivery) {
		t.Errorf("DeadLetter with a receipt handle SQS replaced: %v, want an error wrapping core.ErrStaleDelivery", err)
	}
	if n := len(drain(t, ep, dlq.url)); n != 0 {
		t.Errorf("%d copies parked by a stale dead letter", n)
	}
	if err := redo.Ack(context.Background()); err != nil {
		t.Fatalf("the current delivery's Ack: %v", err)
	}
}
