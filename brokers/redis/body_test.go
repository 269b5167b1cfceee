package redis

import (
	"context"
	"database/sql"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
)

// A producer that knows nothing of idemq adds entries with redis-cli, one
// with its payload in body, one with no body field, one with its payload
// in a field of another name. No handler ever gets an empty body: the two
// without a body field are dead-lettered by the Consumer at the decode
// stage (counted in its stats) with a cause naming the field, the other is
// applied. After the fix (body_field=payload) the third is
// redriven by URL and applied with its payload, while the one with no
// payload at all stays parked.
func TestEntryWithoutBodyFieldIsParked(t *testing.T) {
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
	var mu sync.Mutex
	bodies := map[string]string{}
	consume := func(query string, parked int64, applied int, dead int64) {
		t.Helper()
		src, err := core.OpenSource(ctx, ts.url("group=g&min_idle=1s&poll=50ms"+query))
		if err != nil {
			t.Fatal(err)
		}
		c, stop := run(t, e, src, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
			mu.Lock()
			bodies[m.ID] = string(m.Body)
			mu.Unlock()
			return e.Apply(ctx, tx, m)
		})
		waitFor(t, 10*time.Second, "the entries decided", func() bool {
			return ts.rdb.XLen(ctx, ts.name+":dlq").Val() == parked && len(e.Counts(t)) == applied
		})
		stop()
		if st := c.Stats(); st.DeadLettered != dead {
			t.Errorf("the Consumer counted %d dead letters, want %d", st.DeadLettered, dead)
		}
	}
	xadd("idemq-id", "with-body", "body", `{"amount":1}`)
	xadd("idemq-id", "no-body", "tenant", "t1")
	xadd("idemq-id", "elsewhere", "payload", `{"amount":3}`)
	consume("", 2, 1, 2)
	mu.Lock()
	if len(bodies) != 1 || bodies["with-body"] != `{"amount":1}` {
		t.Errorf("handlers got %q, want only with-body with its body", bodies)
	}
	mu.Unlock()
	dls, err := ts.rawDeadLetters(ctx)
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters %v, %v; want 2", dls, err)
	}
	for _, dl := range dls {
		if !strings.Contains(dl.Cause, "no body field") || !strings.Contains(dl.Cause, "body_field=") || !strings.Contains(dl.Cause, ": "+string(core.StageDecode)+": ") {
			t.Errorf("dead letter %s: cause %q does not name the body field and body_field=", dl.ID, dl.Cause)
		}
		t.Logf("cause: %s", dl.Cause)
	}
	if p := ts.pending(t); len(p) != 0 {
		t.Errorf("pending after parking: %v", p)
	}

	fixed := ts.url("group=g&body_field=payload")
	q, err := admin.OpenDeadLetters(ctx, fixed)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	n, err := admin.Redrive(ctx, q, func(p *admin.Parked) bool { return p.ID == "elsewhere" }, nil)
	if err != nil || n != 1 {
		t.Fatalf("Redrive = %d, %v; want 1", n, err)
	}
	consume("&body_field=payload", 1, 2, 0)
	mu.Lock()
	if bodies["elsewhere"] != `{"amount":3}` {
		t.Errorf("redriven entry's body %q, want its payload", bodies["elsewhere"])
	}
	mu.Unlock()
	// Redriven without a body field, the entry with none is parked again
	// rather than handed over empty.
	if n, err := admin.Redrive(ctx, q, func(p *admin.Parked) bool { return p.ID == "no-body" }, nil); err != nil || n != 1 {
		t.Fatalf("Redrive = %d, %v; want 1", n, err)
	}
	consume("", 1, 2, 1)
	mu.Lock()
	if _, ok := bodies["no-body"]; ok {
		t.Errorf("the entry without a body reached a handler after its redrive")
	}
	mu.Unlock()
}

// The causes and hints speak to what the user set: the missing-id cause
// does not suggest id_field= when it names the field already, the
// missing-body cause names body_field's field, and the retention hint
// tells a producer outside idemq how to trim (XTRIM … MINID).
func TestHintsSpeakToTheSettings(t *testing.T) {
	ts := newTestStream(t, RedisURL(t))
	publish(t, ts, "x")
	s := ts.open(t, WithIDField("order_id"))
	d := receive(t, brokertest.StartReceiver(t, s, 0), 1)[0]
	cause := d.Message().IDError.Error()
	if !strings.Contains(cause, "order_id") || strings.Contains(cause, "names the field") {
		t.Errorf("missing-id cause with id_field=order_id: %q; want the field named, no suggestion to set id_field=", cause)
	}
	d.Ack(context.Background())
	hint := s.HorizonHint(12 * time.Hour)
	for _, want := range []string{"max_age=6h", "XTRIM " + ts.name + " MINID", "XADD " + ts.name + " MINID"} {
		if !strings.Contains(hint, want) {
			t.Errorf("retention hint %q does not say %q", hint, want)
		}
	}
	t.Logf("hint: %s", hint)
}
