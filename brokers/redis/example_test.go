package redis_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/idemq/idemq/brokers/redis"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/sqlite"
)

// A Consumer of the stream orders as a member of the group billing: each
// order is charged once, however often Redis hands it out.
func ExampleOpen() {
	ctx := context.Background()
	src, err := redis.Open(ctx, "redis://127.0.0.1:6379/orders?group=billing")
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.Open(ctx, "billing.db")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	c, err := core.New(src, store, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, body) VALUES (?, ?)`, m.ID, m.Body)
		return err
	}, core.WithName("billing"))
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(c.Run(ctx))
}
