package redis

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

// A private server (append-only file, fsync at every write) crashes
// (SIGKILL) twice and restarts under a running Consumer while messages
// are published: every message is applied exactly once, none lost, none
// doubled.
func TestServerCrashUnderConsumer(t *testing.T) {
	srv := startRedis(t)
	ts := newTestStream(t, "redis://"+srv.addr())
	e := brokertest.NewEffects(t)
	const n = 300
	c, stop := run(t, e, ts.open(t), func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		time.Sleep(5 * time.Millisecond) // slower than the publisher: a backlog at each crash
		return e.Apply(ctx, tx, m)
	}, core.WithBatchSize(10), core.WithWindow(20))
	pub, err := NewPublisher(context.Background(), ts.url(""))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var published, failed atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < n; {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := pub.Publish(ctx, "", &driver.Message{ID: fmt.Sprintf("crash-%03d", i), Body: []byte("x")})
			cancel()
			if err != nil { // published or not, the next try decides: a copy is a Duplicate
				failed.Add(1)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			i++
			published.Store(int64(i))
		}
	}()
	for _, at := range []int64{n / 3, 2 * n / 3} {
		waitFor(t, 30*time.Second, fmt.Sprintf("%d published", at), func() bool { return published.Load() >= at })
		srv.stop(syscall.SIGKILL)
		time.Sleep(1500 * time.Millisecond) // past go-redis's retries and min_idle
		srv.start()
	}
	<-done
	waitFor(t, 60*time.Second, "every message applied", func() bool { return len(e.Counts(t)) == n })
	time.Sleep(1500 * time.Millisecond) // any redelivery of an unacked entry comes within min_idle
	stop()
	for id, k := range e.Counts(t) {
		if k != 1 {
			t.Errorf("%s applied %d times", id, k)
		}
	}
	if failed.Load() == 0 {
		t.Error("no publish failed: the crashes were not seen")
	}
	t.Logf("publishes retried %d; stats: %+v", failed.Load(), c.Stats())
}
