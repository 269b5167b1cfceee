package sqliteoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/sqliteoutbox"
)

// A message the broker rejects is parked after WithMaxAttempts failed
// publishes; the store's outbox.Operator lists it with its cause and,
// once the cause is fixed, redrives it. The idemq command does the same:
// idemq outbox list|redrive|purge|stats --store sqlite://app.db.
func Example_parking() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "sqliteoutbox")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ob, _ := sqliteoutbox.New()
	if err := ob.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if err := ob.Write(ctx, tx, &outbox.Message{ID: "m-1", Destination: "invoices", Key: "c-7", Body: []byte("{}")}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	queues := map[string]bool{"orders": true} // "invoices" does not exist yet
	pub := outbox.PublisherFunc(func(_ context.Context, dest string, msgs ...*driver.Message) error {
		if !queues[dest] {
			return errors.New("no queue " + dest)
		}
		return nil
	})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	relay, err := ob.NewRelay(db, pub, outbox.WithMaxAttempts(1), outbox.WithLogger(quiet))
	if err != nil {
		log.Fatal(err)
	}
	relay.RunOnce(ctx) // fails, and parks the row: its first attempt was its last

	op := ob.Store(db) // an outbox.Operator
	parked, err := op.Parked(ctx, outbox.ParkedFilter{Key: "c-7"})
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range parked {
		fmt.Printf("parked %s after %d attempt: %s\n", p.ID, p.Attempts, p.Cause)
	}

	queues["invoices"] = true // the fix
	n, err := op.Redrive(ctx, outbox.ParkedFilter{Seqs: []int64{parked[0].Seq}})
	if err != nil {
		log.Fatal(err)
	}
	published, err := relay.RunOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("redrove", n, "published", published)
	// Output:
	// parked m-1 after 1 attempt: no queue invoices
	// redrove 1 published 1
}
