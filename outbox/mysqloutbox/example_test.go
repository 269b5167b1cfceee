package mysqloutbox_test

import (
	"context"
	"database/sql"
	"log"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/mysqloutbox"
)

// An order and its event in one MySQL transaction, and a relay polling the
// outbox every 100ms.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "root:@tcp(127.0.0.1:3306)/test")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ob, _ := mysqloutbox.New()
	if err := ob.Migrate(ctx, db); err != nil {
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
	relay, err := ob.NewRelay(db, broker, outbox.WithPollInterval(100*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(relay.Run(ctx))
}
