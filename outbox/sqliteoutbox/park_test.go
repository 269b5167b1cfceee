package sqliteoutbox

import (
	"fmt"
	"testing"

	"github.com/idemq/idemq/outbox/internal/outboxtest"
)

// oldSchema is the outbox table before rows could be parked.
const oldSchema = `CREATE TABLE %s (
	seq          INTEGER PRIMARY KEY AUTOINCREMENT,
	id           TEXT    NOT NULL,
	destination  TEXT    NOT NULL,
	ordering_key TEXT    NULL,
	headers      TEXT    NOT NULL,
	body         BLOB    NOT NULL,
	created_at   INTEGER NOT NULL,
	sent_at      INTEGER NULL,
	attempts     INTEGER NOT NULL DEFAULT 0,
	available_at INTEGER NOT NULL
)`

func TestParking(t *testing.T) {
	outboxtest.Parking(t, func(t *testing.T, old bool) outboxtest.Env {
		db := openDB(t, tempPath(t))
		if old {
			if _, err := db.Exec(fmt.Sprintf(oldSchema, DefaultTable)); err != nil {
				t.Fatal(err)
			}
		}
		o := newOutbox(t, db)
		return outboxtest.Env{Store: o.Store(db), Write: outboxtest.TxWrite(db, o.Write)}
	})
}
