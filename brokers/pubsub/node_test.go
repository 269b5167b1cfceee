package pubsub

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

// nodePublisher is Google's Node.js client (@google-cloud/pubsub) with a
// script publishing test messages, installed by
// `npm ci --prefix brokers/pubsub/testdata/nodepub`.
const nodePublisher = "testdata/nodepub"

// A producer in another language, Google's Node.js client, publishes 200
// payments and a second copy of every fifth (its retry: a new messageId,
// the same business id in message-id): each is applied once, and each
// copy is decided Duplicate.
func TestNodeProducer(t *testing.T) {
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(nodePublisher, "node_modules", "@google-cloud", "pubsub", "package.json"))
	}
	if err != nil {
		msg := fmt.Sprintf("no Node.js Pub/Sub client (run `npm ci --prefix brokers/pubsub/%s`): %v", nodePublisher, err)
		if os.Getenv("IDEMQ_REQUIRE_SERVICES") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ts := newTestSub(t, "")
	const n = 200
	prefix := "node-" + randomHex(3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "publish.mjs", project, ts.topic, fmt.Sprint(n), prefix)
	cmd.Dir = nodePublisher
	cmd.Env = append(os.Environ(), "PUBSUB_EMULATOR_HOST="+emulatorHost(t))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node publish.mjs: %v\n%s", err, out)
	}
	e := brokertest.NewEffects(t)
	var notNode []string
	c, stop := run(t, e, ts.open(t, ""), func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		if m.Headers["producer"] != "node" {
			notNode = append(notNode, m.ID)
		}
		return e.Apply(ctx, tx, m)
	}, core.WithConcurrency(1))
	dups := (n + 4) / 5
	waitFor(t, time.Minute, "every copy decided", func() bool {
		st := c.Stats()
		return st.Processed+st.Duplicates == n+int64(dups)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var want []*driver.Message
	for i := range n {
		want = append(want, &driver.Message{ID: fmt.Sprintf("%s-%d", prefix, i)})
	}
	e.WantOnce(t, want)
	if st := c.Stats(); st.Processed != n || st.Duplicates != int64(dups) {
		t.Errorf("stats %+v, want %d processed and %d duplicates", st, n, dups)
	}
	if len(notNode) > 0 {
		t.Errorf("messages without the Node producer's attribute: %v", notNode)
	}
}
