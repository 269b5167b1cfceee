package nats

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
)

// TestMultiHostURL connects through a URL listing two servers, one with
// nothing listening and a private nats-server, in both orders: the
// Publisher and the Source opened by URL reach the live one whichever
// comes first, and the message published through one is consumed through
// the other. The dead address alone fails to connect, so the live server
// is reached through the list.
func TestMultiHostURL(t *testing.T) {
	live := servicetest.StartNATS(t, "")
	dead := servicetest.FreePort(t)
	liveHost, deadHost := fmt.Sprintf("127.0.0.1:%d", live.Port), fmt.Sprintf("127.0.0.1:%d", dead)
	ctx := ctxFor(t, time.Minute)

	ts := newTestStream(t, live.URL)
	query := "/" + ts.name + "?consumer=worker&subject=" + ts.subject + "&ack_wait=5s"
	if src, err := core.OpenSource(ctx, "nats://"+deadHost+query); err == nil {
		src.Close()
		t.Fatalf("opened a source on %s, where nothing listens", deadHost)
	}
	for i, hosts := range []string{deadHost + "," + liveHost, liveHost + "," + deadHost} {
		u := "nats://" + hosts + query
		pub, err := core.OpenPublisher(ctx, u)
		if err != nil {
			t.Fatalf("OpenPublisher %s: %v", u, err)
		}
		id := fmt.Sprintf("m-%d", i)
		err = pub.Publish(ctx, "", &core.Message{ID: id, Body: []byte(id)})
		pub.Close()
		if err != nil {
			t.Fatalf("Publish through %s: %v", u, err)
		}
		src, err := core.OpenSource(ctx, u)
		if err != nil {
			t.Fatalf("OpenSource %s: %v", u, err)
		}
		if got := src.(*Source).link.nc.ConnectedUrl(); !strings.HasSuffix(got, liveHost) {
			t.Errorf("%s: connected to %s, want the live server %s", u, got, liveHost)
		}
		r := brokertest.StartReceiver(t, src, 0)
		d := receiveOne(t, r, 10*time.Second)
		if m := d.Message(); m.ID != id || string(m.Body) != id || m.Attempt != 1 {
			t.Errorf("through %s: received %q %q attempt %d, want %s", u, m.ID, m.Body, m.Attempt, id)
		}
		if err := d.Ack(ctx); err != nil {
			t.Errorf("Ack through %s: %v", u, err)
		}
		r.Close()
	}
	// Both messages are in the private server's stream, settled.
	st, err := ts.js.Stream(ctx, ts.name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := st.Consumer(ctx, "worker")
	if err != nil {
		t.Fatal(err)
	}
	if n, ci := st.CachedInfo().State.Msgs, c.CachedInfo(); n != 2 || ci.NumPending != 0 || ci.NumAckPending != 0 {
		t.Errorf("stream holds %d messages (want 2), consumer has %d pending and %d unacked", n, ci.NumPending, ci.NumAckPending)
	}
}
