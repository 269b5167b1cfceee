package pubsub

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/idemq/idemq/internal/servicetest"
	"strings"
	"sync"
	"testing"
	"time"

	gps "cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idemq/idemq/core/driver"
)

// The tests run against Google's Pub/Sub emulator: the one at
// IDEMQ_PUBSUB_URL (host:port) when it is set, else a private one that the
// first test needing it starts on a free loopback port (it dies with the
// test binary). The client library reaches it
// through PUBSUB_EMULATOR_HOST, which the tests set for the whole binary.
// Without an emulator a test is skipped naming IDEMQ_PUBSUB_URL, or fails
// with IDEMQ_REQUIRE_SERVICES=1.

const project = "idemq-test"

// emulatorHost returns the emulator's host:port (servicetest.PubSubEmulator),
// checked to answer.
func emulatorHost(t testing.TB) string {
	t.Helper()
	host := servicetest.PubSubEmulator(t)
	pinged.Do(func() { pingErr = ping(host) })
	if pingErr != nil {
		servicetest.Unavailable(t, "%v", pingErr)
	}
	return host
}

var (
	pinged  sync.Once
	pingErr error
)

func ping(host string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := gps.NewClient(ctx, project)
	if err != nil {
		return err
	}
	defer cl.Close()
	_, err = cl.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: "projects/" + project + "/topics/ping"})
	if err != nil && !strings.Contains(err.Error(), "NotFound") {
		return fmt.Errorf("emulator at %s: %w", host, err)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// testSub is a fresh topic with a subscription (and dead letters) made by
// the adapter from its URL, and a raw client of the test's own.
type testSub struct {
	name, topic string // short names
	query       string // the URL's parameters beyond topic=
	cl          *gps.Client
}

// newTestSub makes a topic and subscription through a Source opened with
// the URL's query, and returns it.
func newTestSub(t testing.TB, query string) *testSub {
	t.Helper()
	emulatorHost(t)
	id := randomHex(5)
	ts := &testSub{name: "sub-" + id, topic: "topic-" + id, query: query}
	cl, err := gps.NewClient(context.Background(), project)
	if err != nil {
		t.Fatal(err)
	}
	ts.cl = cl
	t.Cleanup(func() {
		ctx := context.Background()
		for _, s := range []string{ts.name, ts.name + "-dlq"} {
			cl.SubscriptionAdminClient.DeleteSubscription(ctx, &pb.DeleteSubscriptionRequest{Subscription: ts.full("subscriptions", s)})
		}
		for _, tp := range []string{ts.topic, ts.name + "-dlq"} {
			cl.TopicAdminClient.DeleteTopic(ctx, &pb.DeleteTopicRequest{Topic: ts.full("topics", tp)})
		}
		cl.Close()
	})
	s, err := Open(context.Background(), ts.url(""))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	s.Close()
	return ts
}

func (ts *testSub) full(kind, name string) string {
	return "projects/" + project + "/" + kind + "/" + name
}

// url is the subscription's URL with its query and extra parameters.
func (ts *testSub) url(extra string) string {
	u := "pubsub://" + project + "/" + ts.name + "?topic=" + ts.topic
	for _, q := range []string{ts.query, extra} {
		if q != "" {
			u += "&" + q
		}
	}
	return u
}

func (ts *testSub) open(t testing.TB, extra string) *Source {
	t.Helper()
	s, err := Open(context.Background(), ts.url(extra))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// publish publishes msgs with the raw client: the id in message-id, the
// key as the ordering key.
func (ts *testSub) publish(ctx context.Context, msgs ...*driver.Message) error {
	pms := make([]*pb.PubsubMessage, len(msgs))
	for i, m := range msgs {
		attrs := map[string]string{}
		for k, v := range m.Headers {
			attrs[k] = v
		}
		if m.ID != "" {
			attrs["message-id"] = m.ID
		}
		pms[i] = &pb.PubsubMessage{Data: m.Body, Attributes: attrs, OrderingKey: m.Key}
	}
	_, err := ts.cl.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: ts.full("topics", ts.topic), Messages: pms})
	return err
}

// take pulls up to max messages of subscription sub (a short name) with
// the raw client, waiting up to wait, and acknowledges them.
func (ts *testSub) take(ctx context.Context, sub string, max int, wait time.Duration) ([]*pb.PubsubMessage, error) {
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	res, err := ts.cl.SubscriptionAdminClient.Pull(pctx, &pb.PullRequest{Subscription: ts.full("subscriptions", sub), MaxMessages: int32(max)})
	if err != nil && pctx.Err() == nil {
		return nil, err
	}
	var out []*pb.PubsubMessage
	var ids []string
	for _, rm := range res.GetReceivedMessages() {
		out, ids = append(out, rm.Message), append(ids, rm.AckId)
	}
	if len(ids) > 0 {
		err = ts.cl.SubscriptionAdminClient.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: ts.full("subscriptions", sub), AckIds: ids})
	}
	return out, err
}

// seek makes Pub/Sub forget the ack deadlines of the subscription's
// outstanding messages and deliver them again, as a lost lease would: it
// seeks to a time before their publish.
func (ts *testSub) seek(t testing.TB) {
	t.Helper()
	_, err := ts.cl.SubscriptionAdminClient.Seek(context.Background(), &pb.SeekRequest{Subscription: ts.full("subscriptions", ts.name),
		Target: &pb.SeekRequest_Time{Time: timestamppb.New(time.Now().Add(-time.Hour))}})
	if err != nil {
		t.Fatalf("seek: %v", err)
	}
}
