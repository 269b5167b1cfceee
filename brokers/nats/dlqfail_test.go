package nats

import (
	"errors"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// TestDeadLetterPublishFails: when the dead-letter stream is gone under a
// running Source, DeadLetter's publish finds no stream, DeadLetter
// returns the error and gives the message back (Nak), so it is delivered
// again instead of being terminated and lost; once the dead-letter
// stream is back, the message is parked there and leaves the stream's
// consumer.
func TestDeadLetterPublishFails(t *testing.T) {
	ts := newTestStream(t, servicetest.NATSURL(t))
	_, s := receiver(t, ts)
	ctx := ctxFor(t, 30*time.Second)
	dlq := ts.name + "_DLQ"
	dlqInfo, err := ts.js.Stream(ctx, dlq)
	if err != nil {
		t.Fatalf("the declared dead-letter stream: %v", err)
	}
	dlqConfig := dlqInfo.CachedInfo().Config
	if err := ts.publishRaw(ctx, natsgo.MsgIdHdr, &driver.Message{ID: "p-1", Body: []byte("poison")}); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(t, s, 5*time.Second)
	if err := ts.js.DeleteStream(ctx, dlq); err != nil {
		t.Fatal(err)
	}
	if err := d.DeadLetter(ctx, errors.New("cannot parse")); err == nil {
		t.Fatal("DeadLetter succeeded without a dead-letter stream")
	}
	again := receiveOne(t, s, 10*time.Second)
	if m := again.Message(); m.ID != "p-1" || m.Attempt != 2 {
		t.Fatalf("after the failed park: received %q attempt %d, want p-1 attempt 2", m.ID, m.Attempt)
	}

	if _, err := ts.js.CreateStream(ctx, dlqConfig); err != nil {
		t.Fatal(err)
	}
	if err := again.DeadLetter(ctx, errors.New("cannot parse")); err != nil {
		t.Fatalf("DeadLetter with the stream back: %v", err)
	}
	parked, err := ts.js.Stream(ctx, dlq)
	if err != nil {
		t.Fatal(err)
	}
	m, err := parked.GetLastMsgForSubject(ctx, dlqConfig.Subjects[0])
	if err != nil {
		t.Fatalf("the parked copy: %v", err)
	}
	if m.Header.Get(IDHeader) != "p-1" || m.Header.Get(driver.CauseHeader) != "cannot parse" || string(m.Data) != "poison" {
		t.Errorf("parked %v %q", m.Header, m.Data)
	}
	st, err := ts.js.Stream(ctx, ts.name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := st.Consumer(ctx, "worker")
	if err != nil {
		t.Fatal(err)
	}
	servicetest.WaitFor(t, 10*time.Second, "the parked message to leave the consumer", func() bool {
		ci, err := c.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	})
	expectNothing(t, s, 300*time.Millisecond)
}
