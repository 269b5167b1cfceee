package redis

import (
	"context"
	"database/sql"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
)

// A producer that knows nothing of idemq adds entries with redis-cli: one
// without an id field and one whose id is in a message_id field. The
// Consumer parks both with a cause naming id_field=; after the fix
// (id_field=message_id), the second is redriven by URL and applied once
// under its id, while the first stays parked.
func TestRedisCLIProducer(t *testing.T) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		servicetest.Unavailable(t, "no redis-cli: %v", err)
	}
	ts := newTestStream(t, RedisURL(t))
	xadd := func(fields ...string) {
		out, err := exec.Command(cli, append([]string{"-u", ts.base, "XADD", ts.name, "*"}, fields...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-cli XADD: %v\n%s", err, out)
		}
	}
	ctx := context.Background()
	e := brokertest.NewEffects(t)
	consume := func(query string, want func(core.Stats) bool) {
		src, err := core.OpenSource(ctx, ts.url("group=g&min_idle=1s&poll=50ms"+query))
		if err != nil {
			t.Fatal(err)
		}
		c, stop := run(t, e, src, func(ctx context.Context, tx *sql.Tx, m *core.Message) error { return e.Apply(ctx, tx, m) })
		waitFor(t, 10*time.Second, "the entries decided", func() bool { return want(c.Stats()) })
		stop()
	}
	xadd("body", `{"amount":1}`)
	xadd("message_id", "order-42", "body", `{"amount":42}`)
	consume("", func(st core.Stats) bool { return st.DeadLettered == 2 })
	dls, err := ts.rawDeadLetters(ctx)
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters %v, %v; want 2", dls, err)
	}
	for _, dl := range dls {
		if !strings.Contains(dl.Cause, core.ErrMissingID.Error()) || !strings.Contains(dl.Cause, "id_field=") {
			t.Errorf("cause %q does not name %q and id_field=", dl.Cause, core.ErrMissingID)
		}
		t.Logf("cause: %s", dl.Cause)
	}

	fixed := ts.url("group=g&id_field=message_id")
	q, err := admin.OpenDeadLetters(ctx, fixed)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	n, err := admin.Redrive(ctx, q, func(p *admin.Parked) bool { return p.ID == "order-42" }, nil)
	if err != nil || n != 1 {
		t.Fatalf("Redrive = %d, %v; want 1", n, err)
	}
	consume("&id_field=message_id", func(st core.Stats) bool { return st.Processed == 1 })
	if counts := e.Counts(t); len(counts) != 1 || counts["order-42"] != 1 {
		t.Errorf("effects %v, want order-42 once", counts)
	}
	left := 0
	q.Scan(ctx, func(p *admin.Parked) error { left++; return nil })
	if left != 1 {
		t.Errorf("%d dead letters left, want the one without an id", left)
	}
}
