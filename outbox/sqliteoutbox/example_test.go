package sqliteoutbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/sqliteoutbox"
)

// An order and its event in one SQLite transaction, and a relay publishing
// the event. A service would run relay.Run(ctx) instead of RunOnce.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "sqliteoutbox")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// WAL, a busy_timeout longer than a relay's batch, and transactions
	// that take the write lock at BEGIN, as stores/sqlite opens its files.
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
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, customer) VALUES (?, ?)`, "o-1", "c-7"); err != nil {
		log.Fatal(err)
	}
	if err := ob.Write(ctx, tx, &outbox.Message{Destination: "orders", Key: "c-7", Body: []byte(`{"id":"o-1"}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	broker, _ := memory.NewBroker() // any driver.Publisher: rabbitmq, kafka, sqs, memory
	defer broker.Close()
	relay, err := ob.NewRelay(db, broker)
	if err != nil {
		log.Fatal(err)
	}
	n, err := relay.RunOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published", n, "queued", broker.Len("orders"))
	// Output: published 1 queued 1
}
