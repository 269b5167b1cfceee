package servicetest_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/internal/servicetest"
)

// A private three-server JetStream cluster keeps an R3 stream through the
// loss of its leader: a new leader is elected and every message published
// before and after is there.
func TestNATSCluster(t *testing.T) {
	c := servicetest.StartNATSCluster(t, 3)
	nc, err := natsgo.Connect(c.URL, natsgo.MaxReconnects(-1), natsgo.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // elections are slow on a busy machine
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3"}, Replicas: 3, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			for {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := js.Publish(pctx, "r3", []byte(strconv.Itoa(i)), jetstream.WithMsgID(fmt.Sprint(i)))
				cancel()
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("publish %d: %v", i, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	publish(0, 50)
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i := range c.Servers {
		if info.Cluster != nil && info.Cluster.Leader == fmt.Sprintf("n%d", i) {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("no stream leader among the servers: %+v", info.Cluster)
	}
	c.Servers[leader].Kill()
	// A request in flight to the killed server is never answered: each
	// call has a deadline of its own.
	servicetest.WaitFor(t, 2*time.Minute, "a new stream leader", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		info, err := st.Info(cctx)
		return err == nil && info.Cluster != nil && info.Cluster.Leader != "" && info.Cluster.Leader != fmt.Sprintf("n%d", leader)
	})
	publish(50, 100)
	info, err = st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 100 {
		t.Fatalf("the stream holds %d messages after its leader was killed, want 100", info.State.Msgs)
	}
	c.Servers[leader].Start()
}
