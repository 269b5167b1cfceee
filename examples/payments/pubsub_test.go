package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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
	host := pubsubEmulator(t)
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
var pubsub struct {
	once sync.Once
	host string
	err  error
}

// pubsubEmulator returns IDEMQ_PUBSUB_URL, or starts the Google Cloud
// SDK's cloud-pubsub-emulator (beside gcloud) on a free loopback port, and
// sets PUBSUB_EMULATOR_HOST for the service runs. Without one the test is
// skipped, or fails with IDEMQ_REQUIRE_SERVICES=1.
func pubsubEmulator(t *testing.T) string {
	pubsub.once.Do(func() {
		if pubsub.host = strings.TrimPrefix(os.Getenv("IDEMQ_PUBSUB_URL"), "http://"); pubsub.host == "" {
			pubsub.host, pubsub.err = startPubSubEmulator()
		}
		if pubsub.err == nil {
			pubsub.err = os.Setenv("PUBSUB_EMULATOR_HOST", pubsub.host)
		}
	})
	if pubsub.err != nil {
		msg := fmt.Sprintf("no Pub/Sub emulator (set IDEMQ_PUBSUB_URL to one's host:port, or install google-cloud-cli-pubsub-emulator): %v", pubsub.err)
		if os.Getenv("IDEMQ_REQUIRE_SERVICES") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return pubsub.host
}

// startPubSubEmulator starts an emulator that dies with this process.
func startPubSubEmulator() (string, error) {
	launcher, err := exec.LookPath("cloud-pubsub-emulator")
	if err != nil {
		gcloud, gerr := exec.LookPath("gcloud")
		if gerr == nil {
			gcloud, gerr = filepath.EvalSymlinks(gcloud)
		}
		if gerr != nil {
			return "", errors.Join(err, gerr)
		}
		launcher = filepath.Join(filepath.Dir(gcloud), "..", "platform", "pubsub-emulator", "bin", "cloud-pubsub-emulator")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	host := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(host)
	cmd := exec.Command(launcher, "--host=127.0.0.1", "--port="+port)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // the launcher execs java
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return "", err
	}
	started := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Server started") {
				started <- true
				io.Copy(io.Discard, out)
				return
			}
		}
		started <- false
	}()
	select {
	case ok := <-started:
		if ok {
			return host, nil
		}
		err = errors.New("the emulator exited before it started")
	case <-time.After(90 * time.Second):
		err = errors.New("the emulator did not start within 90s")
	}
	cmd.Process.Kill()
	cmd.Wait()
	return "", err
}
