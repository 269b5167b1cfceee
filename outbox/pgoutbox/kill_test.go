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
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/stores/postgres"
)

// relayChild is the relay process of TestRelayProcessKilled: it relays the
// table in IDEMQ_OUTBOX_CHILD ("table queue hangAfter") to RabbitMQ until
// nothing is pending. With hangAfter > 0 it prints CONFIRMED after that
// many confirmed batches and hangs before marking them, for the parent to
// SIGKILL it.
func relayChild(t *testing.T, spec string) {
	f := strings.Fields(spec)
	table := f[0] // f[1], the queue, is each row's destination
	hangAfter, _ := strconv.Atoi(f[2])
	ctx := context.Background()
	pool := newPool(t, postgresURL(t), "relay-child")
	o, err := New(WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := rabbitmq.NewPublisher(ctx, amqpURL(t))
	if err != nil {
		t.Fatal(err)
	}
	var batches atomic.Int64
	hanging := outbox.PublisherFunc(func(ctx context.Context, dest string, msgs ...*core.Message) error {
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
	pgURL, amqpU := postgresURL(t), amqpURL(t)
	ctx := context.Background()
	pool := newPool(t, pgURL, "pgoutbox-test")
	o := newOutbox(t, pool)
	sfx := suffix()
	queue := "idemq-outbox-kill-" + sfx
	declareQueue(t, amqpU, queue)
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
		cmd := exec.Command(os.Args[0], "-test.run=^TestRelayProcessKilled$", "-test.v")
		cmd.Env = append(os.Environ(), fmt.Sprintf("IDEMQ_OUTBOX_CHILD=%s %s %d", o.Table(), queue, hangAfter))
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
	src, err := rabbitmq.Open(ctx, amqpU, queue, rabbitmq.WithLogger(discard()))
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
	if n := count(t, pool, `SELECT count(DISTINCT id) FROM `+effects); n != rows {
		t.Fatalf("%d distinct effects, want %d", n, rows)
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
