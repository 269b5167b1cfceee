package kafka

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// TestPublisherTooLargeIsPermanent: records over the topic's
// max.message.bytes, refused by the broker (MESSAGE_TOO_LARGE), and a
// record over the producer's batch bytes, refused before it is sent, fail
// Publish with an error marked permanent; the broker takes none of a
// refused call's records, and a record that fits still goes through.
func TestPublisherTooLargeIsPermanent(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	servicetest.SetTopicConfig(t, bs, topic, "max.message.bytes", "4096")
	pub, err := NewPublisher(context.Background(), bs)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	small := &driver.Message{ID: "small", Key: "k", Body: []byte("fits")}
	// Random bytes: franz-go compresses batches, and a repeated byte would
	// fit in the limit once compressed.
	large := &driver.Message{ID: "large", Key: "k", Body: []byte(randomHex(8192))}
	for _, msgs := range [][]*driver.Message{{small, large}, {large}} {
		err := pub.Publish(ctx, topic, msgs...)
		if err == nil || !strings.Contains(err.Error(), "MESSAGE_TOO_LARGE") || !core.IsPermanent(err) {
			t.Fatalf("Publish of %d records with one over max.message.bytes = %v, want MESSAGE_TOO_LARGE marked permanent", len(msgs), err)
		}
	}
	huge := &driver.Message{ID: "huge", Body: []byte(randomHex(2 << 20))}
	if err := pub.Publish(ctx, topic, huge); err == nil || !core.IsPermanent(err) {
		t.Fatalf("Publish of a record over the producer's batch bytes = %v, want an error marked permanent", err)
	}
	if got := readAll(t, bs, topic); len(got) != 0 {
		t.Fatalf("topic holds %d records after refused publishes, want none", len(got))
	}
	if err := pub.Publish(ctx, topic, small); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, bs, topic); len(got) != 1 || got[0].headers[DefaultIDHeader] != "small" {
		t.Fatalf("topic holds %+v, want the small record alone", got)
	}
}
