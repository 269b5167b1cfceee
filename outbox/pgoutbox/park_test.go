package pgoutbox

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemq/idemq/outbox/internal/outboxtest"
)

// oldSchema is the outbox table before rows could be parked.
const oldSchema = `CREATE TABLE %s (
	seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id           TEXT        NOT NULL,
	destination  TEXT        NOT NULL,
	ordering_key TEXT,
	headers      JSONB       NOT NULL DEFAULT '{}',
	body         BYTEA       NOT NULL,
	created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
	sent_at      TIMESTAMPTZ,
	attempts     INT         NOT NULL DEFAULT 0,
	available_at TIMESTAMPTZ NOT NULL DEFAULT now()
)`

func TestParking(t *testing.T) {
	pool := newPool(t, postgresURL(t), "idemq_outbox_park")
	outboxtest.Parking(t, func(t *testing.T, old bool) outboxtest.Env {
		ctx := context.Background()
		var o *Outbox
		if old {
			var err error
			if o, err = New(WithTable("outbox_" + suffix())); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+o.ident) })
			if _, err := pool.Exec(ctx, fmt.Sprintf(oldSchema, o.ident)); err != nil {
				t.Fatal(err)
			}
			if err := o.Migrate(ctx, pool); err != nil {
				t.Fatal(err)
			}
		} else {
			o = newOutbox(t, pool)
		}
		return outboxtest.Env{Store: o.Store(pool), Write: txWrite(pool, o)}
	})
}
