package rabbitmq

import (
	"context"
	"database/sql"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/servicetest"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/sqlite"
)

// TestIDHeader: producers that cannot set message_id (amqp-tools'
// amqp-publish, NServiceBus, MassTransit) carry the id in a header. With
// id_header=MessageId the Source reads it there (string, bytes or an
// integer), falls back to message_id when the header is absent, prefers
// the header when both are set, and a header of another type is
// dead-lettered with a cause naming it. Published raw, without message_id,
// each id is applied once, a duplicate not at all.
func TestIDHeader(t *testing.T) {
	url := amqpURL(t)
	queue := uniqueQueue(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := strings.TrimSuffix(url, "/") + "/?queue=" + queue + "&id_header=MessageId"
	src, err := core.OpenSource(ctx, u, core.WithAdapterLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"amount":1}`)
	hdr := func(v any) amqp.Publishing {
		return amqp.Publishing{Headers: amqp.Table{"MessageId": v}, Body: body}
	}
	pubs := []amqp.Publishing{
		hdr("hdr-string"),
		hdr("hdr-string"), // a duplicate
		hdr([]byte("hdr-bytes")),
		hdr(int64(42)),
		{MessageId: "prop-only", Body: body},
		{MessageId: "prop-loses", Headers: amqp.Table{"MessageId": "hdr-wins"}, Body: body},
		hdr(true),
		{Body: body},
	}
	wantApplied := []string{"hdr-string", "hdr-bytes", "42", "prop-only", "hdr-wins"}
	wantCauses := []string{`id header "MessageId" holds a bool`, "no id"}

	ch := testChannel(t, url)
	for _, p := range pubs {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, p); err != nil {
			t.Fatal(err)
		}
	}
	// The broker's own tool, where installed: amqp-publish sets headers
	// (-H) but has no option for message_id.
	if _, err := exec.LookPath("amqp-publish"); err == nil {
		// amqp-tools reads the path "/" as the vhost "", amqp091-go as "/".
		toolURL := strings.TrimSuffix(url, "/")
		for range 2 {
			out, err := exec.CommandContext(ctx, "amqp-publish", "--url="+toolURL, "-r", queue, "-H", "MessageId: from-amqp-publish", "-b", "x").CombinedOutput()
			if err != nil {
				t.Fatalf("amqp-publish: %v\n%s", err, out)
			}
		}
		pubs = append(pubs, amqp.Publishing{}, amqp.Publishing{})
		wantApplied = append(wantApplied, "from-amqp-publish")
	} else if servicetest.Required() {
		t.Fatalf("amqp-publish not in PATH (apt-get install amqp-tools), and %s=1 requires it", servicetest.RequireEnv)
	} else {
		t.Log("amqp-publish not in PATH (apt-get install amqp-tools): only amqp091-go publishes here")
	}

	applied := runEffects(t, src, len(pubs))
	for _, id := range wantApplied {
		if applied[id] != 1 {
			t.Errorf("%q applied %d times, want once (applied: %v)", id, applied[id], applied)
		}
	}
	if len(applied) != len(wantApplied) {
		t.Errorf("applied %v, want exactly %v", applied, wantApplied)
	}
	var causes []string
	for _, d := range drainQueue(t, url, queue+".dlq") {
		cause, _ := d.Headers[driver.CauseHeader].(string)
		causes = append(causes, cause)
	}
	if len(causes) != len(wantCauses) {
		t.Fatalf("dead letters %q, want %d", causes, len(wantCauses))
	}
	for _, want := range wantCauses {
		found := false
		for _, c := range causes {
			found = found || strings.Contains(c, want)
		}
		if !found {
			t.Errorf("no dead letter's cause says %q: %q", want, causes)
		}
	}
}

// runEffects runs a Consumer of src with the SQLite store, its handler
// recording each message's id as an effect, until n messages are decided;
// it returns how often each id was applied.
func runEffects(t *testing.T, src driver.Source, n int, opts ...core.Option) map[string]int {
	t.Helper()
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "effects.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE effects (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	handler := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES (?)`, m.ID)
		return err
	}
	c, err := core.New[*sql.Tx](src, store, handler, append([]core.Option{core.WithName("effects"), core.WithLogger(testLogger(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	deadline := time.Now().Add(30 * time.Second)
	for st := c.Stats(); st.Processed+st.Duplicates+st.DeadLettered < int64(n); st = c.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages decided within 30s; stats %+v", st.Processed+st.Duplicates+st.DeadLettered, n, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	applied := map[string]int{}
	rs, err := store.DB().QueryContext(ctx, `SELECT id FROM effects`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	for rs.Next() {
		var id string
		if err := rs.Scan(&id); err != nil {
			t.Fatal(err)
		}
		applied[id]++
	}
	return applied
}
