package main

import (
	"context"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/internal/servicetest"
)

// TestKillAndRestartNATSPostgres kills the service three times while it
// consumes a JetStream stream. The killed consumer's unacked messages come
// back once their AckWait passes (5s here), so each restart
// resumes from the durable consumer's state on the server.
//
// The duplicate copies are published with a Nats-Msg-Id of their own and
// the business id in idemq-id (as a producer's retry after the duplicate
// window would reach the stream), so the stream holds every one of them
// and each is decided Duplicate before it is acked.
func TestKillAndRestartNATSPostgres(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	messages, kills := killMessages(t), 3
	res := runKillAndRestart(t, onNATS(t, killRun{
		store: store, tables: prefix, ledger: l, messages: messages, duplicates: 0.2, kills: kills, batch: 20, concurrency: 2,
	}))
	// Every copy is a stream message of its own, acked (natsSettled) only
	// after its decision's log line.
	checkCopiesDecided(t, res, messages, kills)
}

// onNATS points r at a fresh stream and checks, after the graceful stop,
// that it holds r.messages and the consumer has none left (natsSettled).
func onNATS(t *testing.T, r killRun) killRun {
	nu := servicetest.NATSURL(t)
	stream := "PAYMENTS_" + strings.ToUpper(randomHex(4))
	servicetest.DeleteStreamsAtCleanup(t, nu, stream, stream+"_DLQ")
	r.broker = nu + "/" + stream + "?consumer=payments&subject=" + strings.ToLower(stream)
	r.settled = func(t *testing.T) { natsSettled(t, nu, stream, r.messages) }
	return r
}

// natsSettled checks that stream holds all the messages published to it,
// copies included, and that the payments consumer has none left to
// deliver or waiting for an ack.
func natsSettled(t *testing.T, natsURL, stream string, messages int) {
	t.Helper()
	nc, err := natsgo.Connect(natsURL, natsgo.Timeout(servicetest.Timeout), natsgo.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().State.Msgs; got != uint64(messages) {
		t.Errorf("stream %s holds %d messages, want %d (originals and copies)", stream, got, messages)
	}
	c, err := s.Consumer(ctx, "payments")
	if err != nil {
		t.Fatal(err)
	}
	ci := c.CachedInfo()
	if ci.NumPending != 0 || ci.NumAckPending != 0 {
		t.Errorf("consumer payments: %d messages pending, %d unacked after the graceful stop", ci.NumPending, ci.NumAckPending)
	}
}
