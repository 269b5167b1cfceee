package nats

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// TestR3StreamLeaderKilled consumes a backlog from a stream with three
// replicas on a private three-server JetStream cluster, through a URL
// naming every server, and SIGKILLs the stream's leader mid-way: every
// message is applied once (0 lost, 0 doubled), the consumer resumes on
// the new leader, and the batches' acks were confirmed by the consumer's
// leader, so nothing is left unacknowledged.
func TestR3StreamLeaderKilled(t *testing.T) {
	const n = 3000
	c := servicetest.StartNATSCluster(t, 3)
	ts := newTestStream(t, c.URL)
	var hosts []string
	for _, s := range c.Servers {
		hosts = append(hosts, fmt.Sprintf("127.0.0.1:%d", s.Port))
	}
	addr := "nats://" + strings.Join(hosts, ",") + ts.addr()[len(ts.url):] + "&replicas=3&ack_wait=5s"
	ctx := ctxFor(t, 5*time.Minute)
	pub, err := NewPublisher(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]*driver.Message, n)
	for i := range msgs {
		msgs[i] = &driver.Message{ID: fmt.Sprintf("pay-%05d", i), Body: []byte("{}")}
	}
	for i := 0; i < n; i += 500 {
		if err := pub.Publish(ctx, "", msgs[i:i+500]...); err != nil {
			t.Fatal(err)
		}
	}
	pub.Close()
	info, err := ts.js.Stream(ctx, ts.name)
	if err != nil {
		t.Fatal(err)
	}
	if r := info.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("the adapter created the stream with %d replicas, want 3", r)
	}

	src, err := Open(ctx, addr, ts.opts(t)...)
	if err != nil {
		t.Fatal(err)
	}
	e := brokertest.NewEffects(t)
	cons, stop := e.Run(t, src, func(ctx context.Context, tx *sql.Tx, m *core.Message) error { return e.Apply(ctx, tx, m) },
		core.WithName("r3"), core.WithBatchSize(50), core.WithLogger(testLogger(t)), core.WithBackoff(core.ConstantBackoff(50*time.Millisecond)))
	decided := func() int64 { st := cons.Stats(); return st.Processed + st.Duplicates }
	servicetest.WaitFor(t, 2*time.Minute, "a third of the backlog decided", func() bool { return decided() >= n/3 })

	st, err := ts.js.Stream(ctx, ts.name)
	if err != nil {
		t.Fatal(err)
	}
	leader := st.CachedInfo().Cluster.Leader
	var killed *servicetest.NATSServer
	for i, s := range c.Servers {
		if leader == fmt.Sprintf("n%d", i) {
			killed = s
		}
	}
	if killed == nil {
		t.Fatalf("stream leader %q is none of the servers", leader)
	}
	at, before := time.Now(), decided()
	killed.Kill()
	// Past what the source held at the kill: fetched from the new leader.
	servicetest.WaitFor(t, time.Minute, "500 decisions after the kill", func() bool { return decided() > before+500 })
	resumed := time.Since(at)
	servicetest.WaitFor(t, 3*time.Minute, "every message decided", func() bool { return len(e.Counts(t)) >= n })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	stats := cons.Stats()
	e.WantOnce(t, msgs)
	if stats.DeadLettered != 0 {
		t.Errorf("stats %+v: nothing may be parked", stats)
	}
	// Every ack reached the consumer's leader: nothing waits for redelivery.
	servicetest.WaitFor(t, 30*time.Second, "no message pending or unacknowledged", func() bool {
		// A request in flight to the killed server is never answered.
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		cinfo, err := ts.js.Consumer(ctx, ts.name, "worker")
		if err != nil {
			return false
		}
		ci, err := cinfo.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	})
	t.Logf("FAULT-MATRIX nats R3: %d messages, leader %s SIGKILLed after %d decisions, 500 more decided %s later; stats %+v", n, leader, before, resumed.Round(time.Millisecond), stats)
}
