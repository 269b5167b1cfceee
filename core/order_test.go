package core_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
)

// With one worker, handlers run in the order the broker delivered, whatever
// the window and batch size, observed or not.
func TestOneWorkerKeepsReceiveOrder(t *testing.T) {
	for _, pl := range pipelines {
		for _, batch := range []int{1, 10} {
			testReceiveOrder(t, pl.name, batch, pl.opts)
		}
	}
}

func testReceiveOrder(t *testing.T, pipeline string, batch int, opts []core.Option) {
	t.Helper()
	e := newEnv(t)
	want := ids(2000, "o")
	e.publish(want...)
	var got []string
	h := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		got = append(got, m.ID) // one worker: no concurrent calls
		return applyEffect(ctx, tx, m)
	}
	e.runUntilIdle(time.Minute, h, append([]core.Option{core.WithBatchSize(batch), core.WithWindow(200)}, opts...)...)
	e.assertExactlyOnce(want)
	if len(got) != len(want) {
		t.Fatalf("%s batch %d: handler ran %d times, want %d", pipeline, batch, len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s batch %d: position %d handled %s, want %s", pipeline, batch, i, got[i], want[i])
		}
	}
}
