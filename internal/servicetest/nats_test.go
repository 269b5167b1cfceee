package servicetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestNATSURL(t *testing.T) {
	u := NATSURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := PingNATS(ctx, u); err != nil {
		t.Fatalf("PingNATS(%s) after NATSURL: %v", u, err)
	}
}

func TestPingNATSUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := PingNATS(ctx, fmt.Sprintf("nats://127.0.0.1:%d", FreePort(t))); err == nil {
		t.Fatal("PingNATS of a closed port returned nil")
	}
}

// TestStartNATS: the private server has JetStream, keeps its streams over
// a restart, and is gone after Stop.
func TestStartNATS(t *testing.T) {
	s := StartNATS(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := natsgo.Connect(s.URL, natsgo.MaxReconnects(-1), natsgo.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KEPT", Subjects: []string{"kept"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "kept", []byte("x")); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	WaitFor(t, 10*time.Second, "a reconnect", nc.IsConnected)
	st, err := js.Stream(ctx, "KEPT")
	if err != nil {
		t.Fatalf("stream after restart: %v", err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("%d messages after restart, want 1", n)
	}
	s.Stop()
	if err := PingNATS(ctx, s.URL); err == nil {
		t.Fatal("the server answers after Stop")
	}
	s.Stop() // a second Stop does nothing
}
