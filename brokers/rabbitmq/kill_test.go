package rabbitmq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/sqlite"
)

// Environment of the child consumer process of TestKilledBetweenCommitAndAck.
const (
	envChildQueue  = "IDEMQ_TEST_CHILD_QUEUE"
	envChildDB     = "IDEMQ_TEST_CHILD_DB"
	envChildKillAt = "IDEMQ_TEST_CHILD_KILL_AT"
)

// killAt wraps a Source: its killAt-th Ack call (a batch's acks, or a
// single one) SIGKILLs the whole process instead. By then the batch's
// transaction has committed; the broker only sees the TCP connection die.
type killAt struct {
	*Source
	n, at atomic.Int64
}

// Ack dies instead of acking on the chosen call.
func (k *killAt) Ack(ctx context.Context, ms []*driver.Message) error {
	if k.n.Add(1) == k.at.Load() {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute) // the signal is on its way
	}
	return k.Source.Ack(ctx, ms)
}

func effectsHandler(ctx context.Context, tx *sql.Tx, m *core.Message) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, m.ID)
	return err
}

// TestKillChild is the consumer process TestKilledBetweenCommitAndAck
// starts and kills; on its own it skips.
func TestKillChild(t *testing.T) {
	q := os.Getenv(envChildQueue)
	if q == "" {
		t.Skip("the child process of TestKilledBetweenCommitAndAck")
	}
	at, _ := strconv.ParseInt(os.Getenv(envChildKillAt), 10, 64)
	ctx := context.Background()
	src, err := Open(ctx, amqpURL(t), WithQueue(q), WithDeclare(false))
	if err != nil {
		t.Fatal(err)
	}
	store, err := sqlite.Open(ctx, os.Getenv(envChildDB))
	if err != nil {
		t.Fatal(err)
	}
	k := &killAt{Source: src}
	k.at.Store(at)
	c, err := core.New[*sql.Tx](k, store, effectsHandler,
		core.WithName("killed"), core.WithBatchSize(10), core.WithWindow(30))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	t.Fatalf("the child was not killed: Run = %v, stats %+v", err, c.Stats())
}

// TestKilledBetweenCommitAndAck runs consumer processes that are killed
// with SIGKILL right after a batch committed and before its ack, three
// times, then drains the queue in this process. Every message's effect
// must be committed exactly once and none lost: the killed process's
// committed but unacked messages come back and are Duplicates.
func TestKilledBetweenCommitAndAck(t *testing.T) {
	url := amqpURL(t)
	q := uniqueQueue(t, url)
	ctx := context.Background()
	dbPath := filepath.Join(t.TempDir(), "killed.db")
	store, err := sqlite.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := store.DB().Exec(`CREATE TABLE effects (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	s0, err := Open(ctx, url, WithQueue(q))
	if err != nil {
		t.Fatal(err)
	}
	s0.Close()
	const unique = 300
	msgs := publishN(t, url, q, "killed", unique)
	pub, err := NewPublisher(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, q, msgs[:unique/5]...); err != nil {
		t.Fatal(err)
	}
	pub.Close()

	for i, at := range []int{4, 7, 3} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), envChildQueue+"="+q, envChildDB+"="+dbPath, envChildKillAt+"="+strconv.Itoa(at))
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("child %d: want death by SIGKILL, got %v\n%s", i+1, err, out)
		}
	}
	var afterKills int
	store.DB().QueryRow(`SELECT count(DISTINCT id) FROM effects`).Scan(&afterKills)
	if afterKills == 0 || afterKills >= unique {
		t.Fatalf("%d ids applied by the killed processes: the kills did not land mid-stream", afterKills)
	}

	src, err := Open(ctx, url, WithQueue(q), WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New[*sql.Tx](src, store, effectsHandler, core.WithName("killed"), core.WithBatchSize(10), core.WithWindow(30))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	stableSince := time.Time{}
	waitUntil(t, 30*time.Second, func() bool {
		var n int
		store.DB().QueryRow(`SELECT count(DISTINCT id) FROM effects`).Scan(&n)
		st := c.Stats()
		if n != unique || st.Received != st.Processed+st.Duplicates || queueDepth(t, url, q) != 0 {
			stableSince = time.Time{}
			return false
		}
		if stableSince.IsZero() {
			stableSince = time.Now()
		}
		return time.Since(stableSince) > 300*time.Millisecond
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := c.Stats()
	var rows, ids int
	if err := store.DB().QueryRow(`SELECT count(*), count(DISTINCT id) FROM effects`).Scan(&rows, &ids); err != nil {
		t.Fatal(err)
	}
	t.Logf("after 3 kills %d ids were applied; the survivor: %+v; effects %d rows for %d ids", afterKills, st, rows, ids)
	if rows != unique || ids != unique {
		t.Fatalf("effects: %d rows for %d ids, want each of %d exactly once", rows, ids, unique)
	}
	// The killed batches committed and were never acked: at least one
	// message of each comes back to the survivor as a Duplicate.
	if st.Duplicates < 3 {
		t.Errorf("survivor saw %d duplicates, want at least one per kill (3)", st.Duplicates)
	}
	if got := fmt.Sprint(queueDepth(t, url, q)); got != "0" {
		t.Errorf("queue depth %s after the drain", got)
	}
}
