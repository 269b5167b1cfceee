package pgoutbox

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/brokers/rabbitmq"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/stores/postgres"
)

// relayChild is the relay process of the relay kill tests: it relays the
// table in IDEMQ_OUTBOX_CHILD ("table destination hangAfter [broker]") to
// the broker (a URL for core.OpenPublisher; RabbitMQ at amqpURL without
// one) until nothing is pending. With hangAfter > 0 it prints CONFIRMED
// after that many confirmed batches and hangs before marking them, for the
// parent to SIGKILL it.
func relayChild(t *testing.T, spec string) {
	f := strings.Fields(spec)
	table := f[0] // f[1], the queue or topic, is each row's destination
	hangAfter, _ := strconv.Atoi(f[2])
	ctx := context.Background()
	pool := newPool(t, postgresURL(t), "relay-child")
	o, err := New(WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	var pub driver.Publisher
	if len(f) > 3 {
		var cp *core.Publisher
		cp, err = core.OpenPublisher(ctx, f[3])
		if err == nil {
			pub = cp.Driver()
		}
	} else {
		pub, err = rabbitmq.NewPublisher(ctx, amqpURL(t))
	}
	if err != nil {
		t.Fatal(err)
	}
	var batches atomic.Int64
	hanging := outbox.PublisherFunc(func(ctx context.Context, dest string, msgs ...*driver.Message) error {
		if err := pub.Publish(ctx, dest, msgs...); err != nil {
			return err
		}
		if n := batches.Add(1); hangAfter > 0 && n == int64(hangAfter) {
			fmt.Println("CONFIRMED")
			select {} // the broker has the batch; the rows are not marked
		}
		return nil
	})
	r, err := o.NewRelay(pool, hanging, outbox.WithBatchSize(10), outbox.WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for {
		n, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// TestRelayProcessKilled runs the relay as a separate process and
// SIGKILLs it after the broker confirmed its third batch and before the
// rows were marked. A new relay process publishes that batch again with
// the rest; an idemq consumer applies every row's effect exactly once,
// deciding the republished copies Duplicate.
func TestRelayProcessKilled(t *testing.T) {
	if spec := os.Getenv("IDEMQ_OUTBOX_CHILD"); spec != "" {
		relayChild(t, spec)
		return
	}
	amqpU := amqpURL(t)
	queue := "idemq-outbox-kill-" + suffix()
	declareQueue(t, amqpU, queue)
	runRelayKill(t, relayKill{dest: queue, ordered: true, source: func(ctx context.Context) (driver.Source, error) {
		return rabbitmq.Open(ctx, amqpU, rabbitmq.WithQueue(queue), rabbitmq.WithLogger(discard()))
	}})
}

// relayKill is one broker's run of runRelayKill.
type relayKill struct {
	dest    string // the rows' destination: queue or topic
	broker  string // the relay's broker URL; "": RabbitMQ at amqpURL
	ordered bool   // the broker delivers one key's messages in order
	source  func(context.Context) (driver.Source, error)
}

// runRelayKill writes 60 rows in one transaction, runs the relay in a
// child process (the test itself, run again with IDEMQ_OUTBOX_CHILD) and
// SIGKILLs it between its third confirmed batch and marking it, relays the
// rest with a second child, then consumes with an idemq consumer over a
// Postgres dedup store: every row's effect applied exactly once (the 10
// republished copies Duplicate), in write order when k.ordered.
func runRelayKill(t *testing.T, k relayKill) {
	t.Helper()
	ctx := context.Background()
	pool := newPool(t, postgresURL(t), "pgoutbox-test")
	o := newOutbox(t, pool)
	sfx := suffix()
	queue := k.dest
	const rows = 60
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := range rows {
			if err := o.Write(ctx, tx, &outbox.Message{Destination: queue, Key: "k", Body: []byte(strconv.Itoa(i + 1))}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	child := func(hangAfter int) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v")
		cmd.Env = append(os.Environ(), strings.TrimSpace(fmt.Sprintf("IDEMQ_OUTBOX_CHILD=%s %s %d %s", o.Table(), queue, hangAfter, k.broker)))
		return cmd
	}
	first := child(3)
	first.Stderr = os.Stderr
	out, err := first.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	confirmed := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "CONFIRMED" {
				confirmed <- true
				return
			}
		}
		confirmed <- false
	}()
	select {
	case ok := <-confirmed:
		if !ok {
			first.Wait()
			t.Fatal("relay process ended without confirming a third batch")
		}
	case <-time.After(30 * time.Second):
		first.Process.Kill()
		t.Fatal("relay process did not confirm a third batch within 30s")
	}
	first.Process.Signal(syscall.SIGKILL)
	first.Wait()
	if n := count(t, pool, "SELECT count(*) FROM "+o.ident+" WHERE sent_at IS NULL"); n != rows-20 {
		t.Fatalf("%d rows pending after the kill, want %d (two batches marked, the third confirmed but not)", n, rows-20)
	}

	second := child(0)
	if out, err := second.CombinedOutput(); err != nil {
		t.Fatalf("second relay process: %v\n%s", err, out)
	}
	if n := count(t, pool, "SELECT count(*) FROM "+o.ident+" WHERE sent_at IS NULL"); n != 0 {
		t.Fatalf("%d rows pending after the second relay", n)
	}

	store, err := postgres.New(pool, postgres.WithTable("kill_processed_"+sfx))
	if err != nil {
		t.Fatal(err)
	}
	store.Migrate(ctx)
	effects := "kill_effects_" + sfx
	pool.Exec(ctx, `CREATE TABLE `+effects+` (seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL, n INT NOT NULL)`)
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+effects+`, kill_processed_`+sfx) })
	src, err := k.source(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New[pgx.Tx](src, store, func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (id, n) VALUES ($1, $2)`, m.ID, string(m.Body))
		return err
	}, core.WithName("kill"), core.WithWindow(1), core.WithLogger(discard()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	deadline := time.Now().Add(30 * time.Second)
	for c.Stats().Processed+c.Stats().Duplicates < rows+10 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	<-done
	st := c.Stats()
	if st.Processed != rows || st.Duplicates != 10 {
		t.Fatalf("consumer %+v: want %d processed and the 10 republished copies as duplicates", st, rows)
	}
	// The effects table has no unique key on id: a doubled effect would
	// show as a second row.
	if n, d := count(t, pool, `SELECT count(*) FROM `+effects), count(t, pool, `SELECT count(DISTINCT id) FROM `+effects); n != rows || d != rows {
		t.Fatalf("%d effects of %d distinct messages, want %d of %d", n, d, rows, rows)
	}
	if !k.ordered {
		return
	}
	// In order: n ascending by application.
	q, _ := pool.Query(ctx, `SELECT n FROM `+effects+` ORDER BY seq`)
	defer q.Close()
	want := 1
	for q.Next() {
		var n int
		q.Scan(&n)
		if n != want {
			t.Fatalf("effect %d applied where %d was due", n, want)
		}
		want++
	}
}
