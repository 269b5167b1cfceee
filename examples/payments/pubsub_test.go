package main

import (
	"context"
	"github.com/idemq/idemq/internal/servicetest"
	"testing"
	"time"

	gps "cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// TestKillAndRestartPubSubPostgres kills the service three times while it
// consumes a Pub/Sub subscription of Google's emulator (IDEMQ_PUBSUB_URL,
// its host:port, or a private one the test starts) at default settings:
// what a killed run held comes back once its 10s ack deadline passes, and
// the copies a producer's retry published (each with a messageId of its
// own, the same business id in message-id) are decided Duplicate. After
// the graceful stop the subscription holds nothing.
func TestKillAndRestartPubSubPostgres(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	runKillAndRestart(t, onPubSub(t, killRun{
		store: store, tables: prefix, ledger: l,
		messages: killMessages(t), duplicates: 0.2, kills: 3, batch: 20, concurrency: 2,
	}))
}

// onPubSub points r at a fresh subscription (created, with its topic and
// dead letters, by the first publish) and checks, once the ledger is
// complete, that nothing is left to deliver.
func onPubSub(t *testing.T, r killRun) killRun {
	host := servicetest.PubSubEmulator(t)
	name := "payments-" + randomHex(4)
	r.broker = "pubsub://idemq-test/" + name + "?topic=" + name
	cl, err := gps.NewClient(context.Background(), "idemq-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	sub := "projects/idemq-test/subscriptions/" + name
	// empty pulls for a second and hands back what it got: true when nothing came.
	empty := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		res, err := cl.SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: sub, MaxMessages: 100})
		var ids []string
		for _, m := range res.GetReceivedMessages() {
			ids = append(ids, m.AckId)
		}
		if len(ids) > 0 {
			cl.SubscriptionAdminClient.ModifyAckDeadline(context.Background(), &pb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: ids})
		}
		return (err == nil || ctx.Err() != nil) && len(ids) == 0
	}
	var since time.Time
	r.drained = func() bool {
		// What a killed run held shows again only after its ack deadline.
		if since.IsZero() {
			since = time.Now()
		}
		return time.Since(since) > 12*time.Second && empty()
	}
	r.settled = func(t *testing.T) {
		if !empty() {
			t.Errorf("subscription %s still delivers messages after the graceful stop", name)
		}
	}
	t.Logf("Pub/Sub emulator at %s, subscription %s", host, name)
	return r
}

// pubsub is a private emulator, shared by the tests of this binary.
