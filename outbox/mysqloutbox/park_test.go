package mysqloutbox

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemq/idemq/outbox/internal/outboxtest"
)

// oldSchema is the outbox table before rows could be parked.
const oldSchema = `CREATE TABLE %[1]s (
	seq          BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
	id           VARBINARY(255) NOT NULL,
	destination  VARBINARY(255) NOT NULL,
	ordering_key VARBINARY(255) NULL,
	headers      LONGTEXT       NOT NULL,
	body         LONGBLOB       NOT NULL,
	created_at   TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	sent_at      TIMESTAMP(6)   NULL DEFAULT NULL,
	attempts     INT            NOT NULL DEFAULT 0,
	available_at TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	KEY %[1]s_pending (sent_at, seq),
	KEY %[1]s_pending_key (ordering_key, sent_at, seq)
) ENGINE=InnoDB`

func TestParking(t *testing.T) {
	db := openDB(t, mysqlURL(t))
	outboxtest.Parking(t, func(t *testing.T, old bool) outboxtest.Env {
		var o *Outbox
		if old {
			var err error
			if o, err = New(WithTable("outbox_" + suffix())); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + o.table + ", " + o.locks()) })
			if _, err := db.Exec(fmt.Sprintf(oldSchema, o.table)); err != nil {
				t.Fatal(err)
			}
			if err := o.Migrate(context.Background(), db); err != nil {
				t.Fatal(err)
			}
		} else {
			o = newOutbox(t, db)
		}
		return outboxtest.Env{Store: o.Store(db), Write: outboxtest.TxWrite(db, o.Write)}
	})
}
