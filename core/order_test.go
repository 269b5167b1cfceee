package core_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
)

// With one worker, handlers run in the order the broker delivered, whatever
// the window and batch size: each delivery has its own goroutine, but they
// enter batches in receive order.
func TestOneWorkerKeepsReceiveOrder(t *testing.T) {
	for _, batch := range []int{1, 10} {
		e := newEnv(t)
		want := ids(2000, "o")
		e.publish(want...)
		var got []string
		h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
			got = append(got, m.ID) // one worker: no concurrent calls
			return applyEffect(ctx, tx, m)
		}
		e.runUntilIdle(time.Minute, h, core.WithBatchSize(batch), core.WithWindow(200))
		e.assertExactlyOnce(want)
		if len(got) != len(want) {
			t.Fatalf("batch %d: handler ran %d times, want %d", batch, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("batch %d: position %d handled %s, want %s", batch, i, got[i], want[i])
			}
		}
	}
}
