package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// Two handlers that take two rows in opposite orders deadlock; Postgres
// aborts one transaction (40P01). The store tells the Consumer it was a
// conflict (driver.Conflicter), so the Consumer runs that transaction again
// at once instead of deciding Retry: no delivery attempt is spent, and each
// effect is applied once.
func TestHandlerDeadlockRunsAgainInPlace(t *testing.T) {
	pool := testPool(t)
	s := openStore(t, pool)
	fx := effectsTable(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, `INSERT INTO `+fx+` (k) VALUES ('a'), ('b')`); err != nil {
		t.Fatal(err)
	}
	b, err := memory.NewBroker()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Publish(ctx, "q", &driver.Message{ID: "ab"}, &driver.Message{ID: "ba"}); err != nil {
		t.Fatal(err)
	}
	sub, err := b.Subscribe("q")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs, attempts := map[string]int{}, map[string][]int{}
	both := make(chan struct{})
	var once sync.Once
	arrived := 0
	h := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		first, second := "a", "b"
		if m.ID == "ba" {
			first, second = "b", "a"
		}
		mu.Lock()
		runs[m.ID]++
		attempts[m.ID] = append(attempts[m.ID], m.Attempt)
		mu.Unlock()
		if _, err := tx.Exec(ctx, `UPDATE `+fx+` SET n = n + 1 WHERE k = $1`, first); err != nil {
			return err
		}
		mu.Lock()
		if arrived++; arrived == 2 {
			once.Do(func() { close(both) })
		}
		mu.Unlock()
		select { // both hold their first row before either takes its second
		case <-both:
		case <-time.After(2 * time.Second):
		}
		if _, err := tx.Exec(ctx, `UPDATE `+fx+` SET n = n + 1 WHERE k = $1`, second); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+fx+` (k) VALUES ($1)`, m.ID)
		return err
	}
	c, err := core.New[pgx.Tx](sub, s, h, core.WithName("conflict"), core.WithConcurrency(2), core.WithBatchSize(1))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	servicetest.WaitFor(t, 30*time.Second, "both messages processed", func() bool { return c.Stats().Processed == 2 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Retried != 0 || st.StoreRetries == 0 {
		t.Errorf("stats %+v: want the deadlocked transaction run again in place (StoreRetries) and no Retry decision", st)
	}
	for _, id := range []string{"ab", "ba"} {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+fx+` WHERE k = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("%s applied %d times, want 1", id, n)
		}
		for _, a := range attempts[id] {
			if a != 1 {
				t.Errorf("%s ran with attempts %v, want every run on the first delivery", id, attempts[id])
				break
			}
		}
	}
	if runs["ab"]+runs["ba"] < 3 {
		t.Errorf("handler runs %v: want one of them run again after the deadlock", runs)
	}
}
