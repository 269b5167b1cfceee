package pgoutbox_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/brokers/rabbitmq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/pgoutbox"
)

// A service writes an order and the event announcing it in one
// transaction: both commit, or neither does.
func ExampleWrite() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer) VALUES ($1, $2)`, "o-1", "c-7"); err != nil {
			return err
		}
		return pgoutbox.Write(ctx, tx, &outbox.Message{
			Destination: "orders",               // queue, topic or routing key
			Key:         "c-7",                  // per-customer commit order
			Body:        []byte(`{"id":"o-1"}`), // ID left empty: a UUIDv7 is assigned
		})
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A relay publishes the outbox to RabbitMQ with publisher confirms. Run it
// in as many processes as you like: they share the rows and keep per-key
// order.
func ExampleOutbox_NewRelay() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	ob, err := pgoutbox.New() // the table "outbox"
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	pub, err := rabbitmq.NewPublisher(ctx, "amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	relay, err := ob.NewRelay(pool, pub, outbox.WithBatchSize(200))
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(relay.Run(ctx)) // until ctx is cancelled
}
